"""Schedules kept in the database (``models.Schedule``): what a row may name, and the task it
declares.

A row names a ``@schedulable`` target (or a ``@scheduled`` task's function) as ``task``, or a
command of ``SCHEDULING['COMMANDS']`` as ``command``; with ``override`` it moves the code's task
of the same name to its trigger instead. Nothing in a row can make the scheduler import a
module or call anything the code did not opt in. Each row becomes a ``TaskDefinition`` like a
decorated task's, and a mistake becomes its error: ``validate()`` raises it for a form, the
schedulers record it on the row and leave the row alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC
from typing import TYPE_CHECKING, Any

from ..conf import SchedulingSettings
from ..schedules.durations import parse_duration
from ..schedules.triggers import make_trigger, parse_zone
from .commands import ManagementCommand, argument_error
from .definition import TaskDefinition
from .options import declared, invalid
from .resolved import resolve

if TYPE_CHECKING:
    from ..models import Schedule
    from .registry import TaskRegistry

__all__ = ["FIELDS", "TRIGGER_FIELDS", "definition_of", "label", "read", "validate"]

#: The trigger's fields, with the ``@scheduled`` option each one gives.
TRIGGER_FIELDS = ("cron", "zone", "fixed_rate", "fixed_delay", "initial_delay")
#: What the schedulers read of each row, in this order.
FIELDS = (
    "name",
    "task",
    "command",
    "override",
    *TRIGGER_FIELDS,
    "args",
    "kwargs",
    "enabled",
    "missed",
    "jitter",
    "lock_at_most_for",
    "lock_at_least_for",
    "error",
)
#: The form's field that a mistake of each kind (``TaskOptions.error_field``) belongs to; the
#: other kinds (no target or two, a move with options) belong to the whole form. Mistakes of
#: the trigger and the arguments: see ``_form_field``.
_FORM_FIELDS = {"task": "task", "command": "command", "name": "name", "lock": "lock_at_most_for"}


def label(name: str) -> str:
    """Return how messages name the schedule *name*."""
    return f"schedule {name!r} (database)"


def definition_of(
    row: Mapping[str, Any],
    *,
    tasks: TaskRegistry,
    conf: SchedulingSettings,
    allowed: Mapping[str, Any] | None = None,
) -> TaskDefinition:
    """Return the task that *row* (the ``FIELDS`` of a ``Schedule``) declares, with the code's
    *tasks* and the settings *conf* (the commands rows may run, the lock times by default).
    *allowed* is ``tasks.schedulable()``, when the caller has it already. Never raises: a
    mistake is the definition's error."""
    definition = _declared(row, tasks, conf.commands, allowed)
    if definition.error is not None:
        return definition
    # What the settings make of it must hold too: a lock held at least longer than the
    # default most, a name a lock cannot take, would fail at every firing.
    try:
        resolve(definition, conf, UTC).lock_configuration()
    except ValueError as exc:
        return _wrong(row["name"], str(exc), field="lock")
    return definition


def _declared(
    row: Mapping[str, Any],
    tasks: TaskRegistry,
    commands: Sequence[str],
    allowed: Mapping[str, Any] | None,
) -> TaskDefinition:
    name = row["name"]
    trigger = {key: row[key] for key in TRIGGER_FIELDS if row[key]}
    if row["override"]:
        return _moved(name, trigger, row, tasks)
    targets = [key for key in ("task", "command") if row[key]]
    if len(targets) != 1:
        has = "both a task and a command" if targets else "neither a task nor a command"
        return _wrong(name, f"the schedule has {has}; give one of them", field="target")
    if name in tasks:
        return _wrong(
            name,
            f"a task of the code is named {name!r}; give the schedule another name, or make it "
            "move that task (override)",
            field="name",
        )
    if row["task"]:
        allowed = tasks.schedulable() if allowed is None else allowed
        target = allowed.get(row["task"])
        if target is None:
            return _wrong(
                name,
                f"{row['task']!r} is not schedulable; the code lets schedules name "
                f"{_listed(allowed)} (mark a function @schedulable to add it)",
                field="task",
            )
    else:
        command = row["command"]
        if command not in commands:
            return _wrong(
                name,
                f"the command {command!r} is not in SCHEDULING['COMMANDS'] ({_listed(commands)}); "
                "add it there to let schedules run it",
                field="command",
            )
        args, kwargs = row["args"], row["kwargs"]
        if isinstance(args, list) and isinstance(kwargs, Mapping):
            problem = argument_error(command, args, kwargs)
            if problem is not None:
                return _wrong(name, problem, field="function")
        target = ManagementCommand(command)
    options = {
        **trigger,
        "name": name,
        "args": row["args"],
        "kwargs": row["kwargs"],
        "missed": row["missed"] or None,
        "jitter": row["jitter"] or None,
        "lock_at_most_for": row["lock_at_most_for"] or None,
        "lock_at_least_for": row["lock_at_least_for"] or None,
    }
    given = {key: value for key, value in options.items() if value is not None}
    return declared(target, given, declared_in=label(name))


def _moved(
    name: str, trigger: dict[str, Any], row: Mapping[str, Any], tasks: TaskRegistry
) -> TaskDefinition:
    """Return the code's task *name* with the trigger of the override *row*; its other options
    stay the code's."""
    if row["task"] or row["command"]:
        return _wrong(
            name,
            "a row that moves a code task names no task or command; clear them",
            field="target",
        )
    extra = [field for field, empty in _NOT_MOVED.items() if row[field] != empty]
    if extra:
        return _wrong(
            name,
            f"a row that moves a code task gives it a trigger only (the other options stay the "
            f"code's); clear {', '.join(extra)}",
            field="moved",
        )
    if name not in tasks or (code := tasks.get(name)).error is not None:
        return _wrong(
            name,
            f"there is no task {name!r} in the code to move; give the name of a @scheduled task",
            field="name",
        )
    missed = code.trigger_options.get("missed")
    options = {**trigger, **({"missed": missed} if missed is not None else {})}
    try:
        make_trigger(**options)
    except (ValueError, TypeError) as exc:
        return _wrong(name, str(exc), field="trigger")
    return dataclasses.replace(code, trigger_options=options)


#: The fields a row that moves a code task leaves as they are by default: the code's own
#: options apply.
_NOT_MOVED = {
    "args": [],
    "kwargs": {},
    "missed": "coalesce",
    "jitter": "",
    "lock_at_most_for": "",
    "lock_at_least_for": "",
}


def _wrong(name: str, error: str, *, field: str) -> TaskDefinition:
    return invalid(None, name, error, field=field, declared_in=label(name))


def _listed(names: Iterable[str]) -> str:
    listed = sorted(names)
    return ", ".join(map(repr, listed)) if listed else "none"


def read(*, using: str) -> list[dict[str, Any]]:
    """Return every schedule in the database, as dicts of ``FIELDS``, in one query."""
    from ..models import Schedule

    rows = Schedule.objects.using(using).order_by("name").values_list(*FIELDS)
    return [dict(zip(FIELDS, row, strict=True)) for row in rows]


def validate(schedule: Schedule) -> None:
    """Raise ``ValidationError`` for what would keep *schedule* from running, on the form's
    field it belongs to (``Schedule.clean()``)."""
    from django.core.exceptions import ValidationError

    from ..conf import get_settings
    from .registry import registry

    row = {key: getattr(schedule, key) for key in FIELDS}
    if not isinstance(row["args"], list):
        raise ValidationError({"args": 'Give the arguments as a JSON list, e.g. [1, "a"].'})
    if not isinstance(row["kwargs"], dict):
        raise ValidationError(
            {"kwargs": 'Give the keyword arguments as a JSON object, e.g. {"full": true}.'}
        )
    field_errors = _field_errors(row)
    if field_errors:
        raise ValidationError(field_errors)
    definition = definition_of(row, tasks=registry, conf=get_settings())
    if definition.error is None:
        return
    field = _form_field(definition.error_field, row)
    if field is None:
        raise ValidationError(definition.error)
    raise ValidationError({field: definition.error})


#: The fields that hold a duration, and whether zero is allowed in each.
_DURATIONS = {
    "fixed_rate": False,
    "fixed_delay": False,
    "initial_delay": True,
    "jitter": True,
    "lock_at_most_for": False,
    "lock_at_least_for": True,
}


def _field_errors(row: Mapping[str, Any]) -> dict[str, str]:
    """Return the mistakes that one field shows on its own: a duration or a time zone that
    cannot be read (the task's checks would name the trigger as a whole)."""
    errors = {}
    for field, zero in _DURATIONS.items():
        if row[field]:
            try:
                parse_duration(row[field], name=field, allow_zero=zero)
            except ValueError as exc:
                errors[field] = str(exc)
    if row["zone"]:
        try:
            parse_zone(row["zone"])
        except ValueError as exc:
            errors["zone"] = str(exc)
    return errors


def _form_field(kind: str | None, row: Mapping[str, Any]) -> str | None:
    """Return the form's field that a mistake of *kind* belongs to (None: the whole form)."""
    if kind == "function":
        return "kwargs" if row["kwargs"] and not row["args"] else "args"
    if kind == "trigger":
        given = [key for key in TRIGGER_FIELDS if row[key]]
        return given[0] if len(given) == 1 else None
    return _FORM_FIELDS.get(kind or "")
