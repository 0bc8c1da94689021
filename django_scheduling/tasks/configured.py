"""Tasks declared in settings: ``SCHEDULING["SCHEDULE"]``, for code the project does not
decorate and for management commands.

::

    SCHEDULING = {
        "SCHEDULE": {
            "sessions.clear": {"command": "clearsessions", "cron": "0 0 4 * * *"},
            "reports.digest": {"task": "reports.jobs.send_digest", "cron": "0 0 7 * * MON-FRI"},
        },
    }

The key is the task's name. An entry names exactly one target, ``"task"`` (the dotted path of a
function, a django.tasks ``Task`` or a Celery task, called or enqueued as with ``@scheduled``)
or ``"command"`` (a management command, run with ``call_command()``), and takes the options of
``@scheduled`` under the same names. Each entry becomes a ``TaskDefinition`` like a decorated
task's; a mistake becomes its error, which ``manage.py check`` reports naming the entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .commands import ManagementCommand, argument_error
from .definition import TaskDefinition
from .options import declared, invalid

__all__ = ["TARGETS", "configured", "entry_label"]

#: The keys that name an entry's target.
TARGETS = ("task", "command")


def entry_label(name: str) -> str:
    """Return how messages name the entry *name*: ``SCHEDULING['SCHEDULE']['sessions.clear']``."""
    return f"SCHEDULING['SCHEDULE'][{name!r}]"


def configured(name: str, entry: Mapping[str, Any]) -> TaskDefinition:
    """Return the task that the entry *name* of ``SCHEDULING["SCHEDULE"]`` declares. Never
    raises: a mistake (no target or two, a path that does not import, an unknown command,
    arguments that do not fit, a wrong option) is the definition's error."""
    options = {key: value for key, value in entry.items() if key not in TARGETS}
    targets = [key for key in TARGETS if key in entry]
    if len(targets) != 1:
        given = "both 'task' and 'command'" if targets else "neither 'task' nor 'command'"
        return _wrong(
            name,
            f"the entry has {given}; give one: 'task': 'app.module.function' (a function, "
            "django.tasks Task or Celery task) or 'command': 'clearsessions' (a management "
            "command)",
        )
    if "name" in options:
        return _wrong(name, "the entry has 'name': its key is the task's name; drop 'name'")
    if "task" in entry:
        path = entry["task"]
        if not isinstance(path, str) or "." not in path:
            return _wrong(
                name,
                f"the entry's 'task' is {path!r}; give the dotted path of a function, a "
                "django.tasks Task or a Celery task, e.g. 'reports.jobs.send_digest'",
                field="entry",
            )
        try:
            target = _import(path)
        except Exception as exc:  # the module may raise anything while it is imported
            return _wrong(
                name,
                f"the entry's 'task' {path!r} does not import ({type(exc).__name__}: {exc}); "
                "give the dotted path of a function, a django.tasks Task or a Celery task",
                field="entry",
            )
    else:
        command = entry["command"]
        if not isinstance(command, str) or not command:
            return _wrong(
                name,
                f"the entry's 'command' is {command!r}; give a management command's name, e.g. "
                "'clearsessions'",
                field="entry",
            )
        args, kwargs = options.get("args", ()), options.get("kwargs") or {}
        if isinstance(args, tuple | list) and isinstance(kwargs, Mapping):
            problem = argument_error(command, args, kwargs)
            if problem is not None:
                return _wrong(name, problem)
        target = ManagementCommand(command)
    return declared(target, {**options, "name": name}, declared_in=entry_label(name))


def _import(path: str) -> Any:
    from django.utils.module_loading import import_string

    return import_string(path)


def _wrong(name: str, error: str, *, field: str = "entry") -> TaskDefinition:
    return invalid(None, name, error, field=field, declared_in=entry_label(name))
