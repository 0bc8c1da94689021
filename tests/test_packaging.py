"""What a ``pip install django-scheduling`` brings: its dependencies, and the files in the wheel."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from tempfile import TemporaryDirectory

import pytest
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
        self.assertEqual(PROJECT["license"], {"text": "BSD-3-Clause"})


@pytest.mark.processes
class WheelTests(SimpleTestCase):
    def test_the_wheel_holds_the_license_templates_and_static_files(self):
        with TemporaryDirectory() as directory:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "wheel",
                    "--quiet",
                    "--no-deps",
                    "--wheel-dir",
                    directory,
                    str(ROOT),
                ],
                check=True,
                capture_output=True,
                timeout=300,
            )
            [wheel] = Path(directory).glob("django_scheduling-*.whl")
            with zipfile.ZipFile(wheel) as archive:
                names = set(archive.namelist())
                metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
                requires = [
                    line.partition(": ")[2]
                    for line in archive.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist: ")
                ]
        licenses = [name for name in names if name.rpartition("/")[2] == "LICENSE"]
        self.assertEqual(len(licenses), 1, sorted(names))
        self.assertTrue(licenses[0].split("/")[0].endswith(".dist-info"), licenses)
        self.assertIn("django_scheduling/py.typed", names)
        self.assertTrue(any(n.startswith("django_scheduling/templates/") for n in names))
        self.assertFalse(any(n.startswith(("tests/", "example_")) for n in names), sorted(names))
        unconditional = [r for r in requires if "extra ==" not in r]
        self.assertEqual(requirement_names(unconditional), {"django"}, requires)
