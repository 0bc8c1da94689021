"""System checks: mistakes in tasks and settings are reported before anything runs."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from .conf import get_settings
from .locking import SUPPORTED_VENDORS
from .registry import TaskDefinition, registry


@checks.register("django_scheduling")
def check_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report tasks whose trigger, lock options or name are wrong, and duplicate names."""
    errors: list[checks.CheckMessage] = []
    ids = {"trigger": "E001", "lock": "E003", "name": "E007"}
    hints = {
        "trigger": "Fix the options of @scheduled(...); the README lists them with examples.",
        "lock": "lock_at_most_for must be positive and at least lock_at_least_for.",
        "name": "Give the task a shorter or non-empty name='...'.",
    }
    for definition in registry:
        if definition.error:
            field = definition.error_field or "trigger"
            errors.append(
                checks.Error(
                    f"Task {_label(definition)}: {definition.error}",
                    hint=hints.get(field),
                    obj=definition.origin,
                    id=f"django_scheduling.{ids.get(field, 'E001')}",
                )
            )
    for first, second in registry.duplicates:
        errors.append(
            checks.Error(
                f"Two tasks are named {first.name!r}: {first.origin} and {second.origin}.",
                hint="Give one of them another name='...'.",
                obj=second.origin,
                id="django_scheduling.E002",
            )
        )
    return errors


@checks.register("django_scheduling")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report a wrong SCHEDULING setting, an unsupported database and USE_TZ = False."""
    try:
        conf = get_settings()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="See the README's list of SCHEDULING keys and their defaults.",
                id="django_scheduling.E004",
            )
        ]
    errors: list[checks.CheckMessage] = []
    if conf.database not in settings.DATABASES:
        errors.append(
            checks.Error(
                f"SCHEDULING['DATABASE'] is {conf.database!r}, which is not in DATABASES.",
                hint=f"Use one of {', '.join(map(repr, settings.DATABASES))}.",
                id="django_scheduling.E005",
            )
        )
    elif connections[conf.database].vendor not in SUPPORTED_VENDORS:
        errors.append(
            checks.Error(
                f"The database {conf.database!r} is {connections[conf.database].vendor}, which "
                "django_scheduling does not support.",
                hint="Use MySQL/MariaDB, PostgreSQL or SQLite, or point SCHEDULING['DATABASE'] "
                "at one.",
                id="django_scheduling.E005",
            )
        )
    if not settings.USE_TZ:
        errors.append(
            checks.Error(
                "django_scheduling needs USE_TZ = True.",
                hint="Set USE_TZ = True: fire times and locks are stored in UTC, and naive "
                "times are ambiguous at DST changes.",
                id="django_scheduling.E006",
            )
        )
    return errors


def _label(definition: TaskDefinition) -> str:
    """Name the task, and its function when the name does not already say it."""
    if definition.name == definition.origin:
        return repr(definition.name)
    return f"{definition.name!r} ({definition.origin})"
