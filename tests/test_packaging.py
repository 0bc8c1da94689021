"""What a ``pip install django-scheduling`` brings: its dependencies and its license. The wheel
itself is built, checked and installed by the ``package`` session of noxfile.py
(``scripts/wheel-smoke-test``)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from django.test import SimpleTestCase

from .processes import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        name = requirement.split(";")[0].split("[")[0]
        for operator in "<>=!~ ":
            name = name.split(operator)[0]
        names.add(name.strip().lower())
    return names


def imported_modules(package: Path) -> set[str]:
    modules = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules


class DependencyTests(SimpleTestCase):
    def test_django_environ_is_for_the_example_project_and_the_tests_only(self):
        self.assertNotIn("environ", imported_modules(ROOT / "django_scheduling"))
        self.assertNotIn("django-environ", requirement_names(PROJECT["dependencies"]))
        extras = PROJECT["optional-dependencies"]
        self.assertIn("django-environ", requirement_names(extras["test"]))
        self.assertIn("django-environ", requirement_names(extras["example"]))
        # The example project and the test settings do import it.
        self.assertIn("environ", imported_modules(ROOT / "example_project"))

    def test_the_license_is_bsd_3_clause(self):
        text = (ROOT / "LICENSE").read_text()
        self.assertTrue(text.startswith("BSD 3-Clause License"), text[:80])
        self.assertIn("Copyright (c) 2026, django-scheduling contributors", text)
        self.assertEqual(PROJECT["license"], "BSD-3-Clause")
        self.assertEqual(PROJECT["license-files"], ["LICENSE"])
