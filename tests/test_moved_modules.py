"""Modules that moved into subpackages are importable at their old paths for one more release,
with a ``DeprecationWarning`` that names the new path."""

from __future__ import annotations

import importlib
import sys

import pytest

from django_scheduling._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_gives_the_new_module_with_a_warning(old: str) -> None:
    name, new = f"django_scheduling.{old}", f"django_scheduling.{MOVED[old]}"
    sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning, match=f"{name} has moved to {new}"):
        module = importlib.import_module(name)
    assert module is importlib.import_module(new)
    # It keeps its own spec: its relative imports resolve from its new place.
    assert module.__spec__.name == new


def test_names_imported_from_an_old_path_are_the_new_ones() -> None:
    sys.modules.pop("django_scheduling.cron", None)
    with pytest.warns(DeprecationWarning):
        from django_scheduling.cron import CronExpression
    from django_scheduling.schedules.cron import CronExpression as moved

    assert CronExpression is moved


def test_unknown_modules_are_still_unknown() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("django_scheduling.no_such_module")
