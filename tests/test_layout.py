"""The package's size limits: no module over 600 lines and no class over 400, so that each part
keeps one job (see docs/internals.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import django_scheduling

MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400

PACKAGE = Path(django_scheduling.__file__).parent


def _modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts)


def test_the_package_has_modules_to_measure():
    assert len(_modules()) > 50


def test_no_module_is_over_the_limit():
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in _modules()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_class_is_over_the_limit():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_CLASS_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
    assert long == {}
