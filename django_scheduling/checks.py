"""System checks: mistakes in tasks and settings are reported before anything runs.

Each mistake stops the scheduler, and only the scheduler. ``manage.py check``, ``runscheduler``
and ``scheduling_status`` report them as errors; the other commands that run the system checks
(``runserver``, ``migrate``, ...) show them as warnings and carry on, because the rest of the
project works without a scheduler. ``scheduler_errors()`` returns them as errors in any process,
for code that wants to show why the scheduler is not running.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from .conf import InvalidSettings, SchedulingSettings, get_settings
from .locking import provider_class
from .storage.errors import SUPPORTED_VENDORS
from .tasks import engines
from .tasks.registry import TaskDefinition, TaskRegistry, registry

__all__ = [
    "check_tasks",
    "check_settings",
    "check_engines",
    "scheduler_errors",
    "describe",
    "BLOCKING_COMMANDS",
    "report_for",
]

#: The commands in which a mistake is an error: they check the project or run the scheduler.
BLOCKING_COMMANDS = frozenset({"check", "runscheduler", "scheduling_status"})
#: The management command this process runs (``report_for()``); ``None``: none.
_command: str | None = None


def report_for(command: str | None) -> None:
    """Report the mistakes as the process that runs *command* (``None``: a server, a script, a
    test runner) must: as errors, unless it is a command that does not need the scheduler.
    ``AppConfig.ready()`` says which, from the command line."""
    global _command
    _command = command


_TASK_IDS = {
    "trigger": "E001",
    "lock": "E003",
    "recover": "E003",
    "name": "E007",
    "function": "E009",
    "option": "E011",
    "limits": "E011",
    "engine": "E012",
    "entry": "E013",
}
_TASK_HINTS = {
    "trigger": "Fix the options of @scheduled(...); docs/tasks.md lists them with examples.",
    "lock": "lock_at_most_for must be positive and at least lock_at_least_for.",
    "recover": "recover=True works with locked tasks only.",
    "name": "Give the task a shorter or non-empty name='...'.",
    "function": "Give the parameters default values, or decorate a module-level function "
    "(a method needs an instance, which the scheduler does not have).",
    "option": "Write the options of @scheduled(...) by keyword, with the names the docs list "
    "(cron=, zone=, fixed_rate=, fixed_delay=, ...).",
    "limits": "timeout= takes a positive duration; retries= a whole number, with "
    "retry_backoff= and retry_backoff_max= as durations.",
    "engine": "An enqueued task runs on the engine's workers: set such limits and retries on "
    "the engine's task.",
    "entry": "Each entry of SCHEDULING['SCHEDULE'] names one target, 'task' (a dotted path) or "
    "'command' (a management command), with the options of @scheduled; docs/tasks.md shows "
    "examples.",
}


@checks.register("django_scheduling")
def check_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report tasks whose trigger, lock options, name or function are wrong, and duplicate
    names."""
    return _as_reported_here(task_errors())


@checks.register("django_scheduling")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report a wrong SCHEDULING setting, an unsupported database and USE_TZ = False."""
    return _as_reported_here(settings_errors())


def scheduler_errors(
    tasks: TaskRegistry | None = None, conf: SchedulingSettings | None = None
) -> list[checks.Error]:
    """Return every mistake that stops the scheduler from starting; empty when there is none.

    *tasks* defaults to the registry of ``@scheduled`` tasks, *conf* to the ``SCHEDULING``
    setting. No I/O: this is safe to call from ``AppConfig.ready()`` and from a request.
    """
    return task_errors(tasks) + settings_errors(conf)


def task_errors(tasks: TaskRegistry | None = None) -> list[checks.Error]:
    """Return the mistakes in the declared tasks."""
    tasks = registry if tasks is None else tasks
    errors = [
        checks.Error(
            f"Task {_label(definition)}: {definition.error}",
            hint=_TASK_HINTS.get(definition.error_field or "trigger"),
            obj=definition.origin,
            id=f"django_scheduling.{_TASK_IDS.get(definition.error_field or 'trigger', 'E001')}",
        )
        for definition in tasks
        if definition.error
    ]
    errors += [
        checks.Error(
            f"Two tasks are named {first.name!r}: {first.origin} and {second.origin}."
            if first.func is not second.func
            else f"Two @scheduled lines on {first.origin} give the same name {first.name!r}.",
            hint="Give one of them another name='...'.",
            obj=second.origin,
            id="django_scheduling.E002",
        )
        for first, second in tasks.duplicates
    ]
    errors += [error for d in tasks if not d.error for error in _engine_errors(d)]
    errors += [
        checks.Error(
            f"{where}: {problem}.",
            hint="@schedulable takes an optional name='...' and marks a function, a "
            "django.tasks Task or a Celery task.",
            obj=where,
            id="django_scheduling.E014",
        )
        for where, problem in tasks.schedulable_errors
    ]
    errors += [
        checks.Error(
            f"@schedulable(name={name!r}) is also the name of the task {tasks.get(name).origin}: "
            "a schedule in the database naming it could mean either.",
            hint="Give the @schedulable target another name='...'.",
            obj=name,
            id="django_scheduling.E014",
        )
        for name in tasks.shadowing()
    ]
    return errors


def _engine_errors(definition: TaskDefinition) -> list[checks.Error]:
    """Return the mistakes of a task that enqueues on django.tasks: a backend alias that TASKS
    does not define. (Firings never set ``run_after``: any backend can take them.)"""
    if definition.engine != engines.DJANGO_TASKS:
        return []
    alias = engines.backend_alias(definition.func)
    configured = engines.task_backends().settings
    if alias in configured:
        return []
    return [
        checks.Error(
            f"Task {_label(definition)} enqueues on the django.tasks backend {alias!r}, which "
            "is not in TASKS.",
            hint=f"Add {alias!r} to TASKS, or give @task(backend=...) one of "
            f"{', '.join(map(repr, configured)) or 'the TASKS aliases'}.",
            obj=definition.origin,
            id="django_scheduling.E010",
        )
    ]


@checks.register("django_scheduling")
def check_engines(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn about scheduled django.tasks Tasks whose backend runs them in the scheduler's
    process (ImmediateBackend) or never (DummyBackend)."""
    warnings: list[checks.CheckMessage] = []
    for definition in registry:
        if definition.error or definition.engine != engines.DJANGO_TASKS:
            continue
        alias = engines.backend_alias(definition.func)
        if alias not in engines.task_backends().settings:
            continue  # check_tasks reports it
        try:
            backend = engines.task_backends()[alias]
        except Exception as exc:  # a backend that cannot be built: bad OPTIONS, an import
            warnings.append(
                checks.Error(
                    f"Task {_label(definition)} enqueues on the backend {alias!r}, which "
                    f"cannot be loaded: {type(exc).__name__}: {exc}",
                    hint=f"Fix TASKS[{alias!r}] in your settings.",
                    obj=definition.origin,
                    id="django_scheduling.E010",
                )
            )
            continue
        kinds = {klass.__name__ for klass in type(backend).__mro__}
        if "ImmediateBackend" in kinds:
            warnings.append(
                checks.Warning(
                    f"Task {_label(definition)} enqueues on the backend {alias!r} "
                    f"({type(backend).__name__}), which runs it at once inside the "
                    "scheduler's process.",
                    hint="Point the task at a backend with workers (e.g. "
                    "django_tasks_db.DatabaseBackend), or drop @task to run it in the "
                    "scheduler's pool on purpose.",
                    obj=definition.origin,
                    id="django_scheduling.W010",
                )
            )
        elif "DummyBackend" in kinds:
            warnings.append(
                checks.Warning(
                    f"Task {_label(definition)} enqueues on the backend {alias!r} "
                    f"({type(backend).__name__}), which never runs it.",
                    hint="Point the task at a backend with workers (e.g. "
                    "django_tasks_db.DatabaseBackend).",
                    obj=definition.origin,
                    id="django_scheduling.W011",
                )
            )
    return warnings


def settings_errors(conf: SchedulingSettings | None = None) -> list[checks.Error]:
    """Return the mistakes in the ``SCHEDULING`` setting, the database (its alias, vendor and
    ``TIME_ZONE``) and ``USE_TZ``."""
    errors: list[checks.Error] = []
    if conf is None:
        try:
            conf = get_settings()
        except InvalidSettings as exc:
            errors += [
                checks.Error(
                    problem,
                    hint="docs/settings.md lists the SCHEDULING keys and their defaults.",
                    id="django_scheduling.E004",
                )
                for problem in exc.problems
            ]
    if conf is not None:
        errors += _provider_errors(conf.lock_provider)
        errors += _command_errors(conf.commands)
    if conf is None:
        pass  # the database alias is unknown while the setting cannot be read
    elif conf.database not in settings.DATABASES:
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
                id="django_scheduling.E008",
            )
        )
    elif (zone := _local_time_zone(connections[conf.database])) is not None:
        errors.append(
            checks.Error(
                f"The database {conf.database!r} has TIME_ZONE {zone!r}, but django_scheduling "
                "stores its lock and run times in UTC and compares them with the database's UTC "
                "clock: locks would expire at the wrong time, and runs would be marked lost.",
                hint="Point SCHEDULING['DATABASE'] at an alias of the same database without "
                "TIME_ZONE (Django then stores UTC in the scheduling tables), or remove "
                "TIME_ZONE from this one.",
                id="django_scheduling.E016",
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


def _local_time_zone(conn: Any) -> str | None:
    """Return the ``TIME_ZONE`` that *conn*'s database stores its times in, when it has no time
    zone support of its own (MySQL, SQLite) and that zone is not UTC."""
    zone = conn.settings_dict.get("TIME_ZONE")
    return None if conn.features.supports_timezones or zone in (None, "UTC") else zone


def _command_errors(commands: Sequence[str]) -> list[checks.Error]:
    """Return the names in ``SCHEDULING['COMMANDS']`` that are no management command."""
    from django.core.management import get_commands

    known = get_commands()
    return [
        checks.Error(
            f"SCHEDULING['COMMANDS'] lists {command!r}, which is no management command.",
            hint=f"Fix the name{_close(command, known)}, or drop it; manage.py help lists the "
            "commands.",
            id="django_scheduling.E015",
        )
        for command in commands
        if command not in known
    ]


def _close(name: str, names: Sequence[str] | Any) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _provider_errors(setting: str) -> list[checks.Error]:
    """Return the mistake in ``LOCK_PROVIDER``: a class that cannot be imported or is no lock
    provider."""
    try:
        provider_class(setting)
    except (ImportError, TypeError) as exc:
        return [
            checks.Error(
                f"SCHEDULING['LOCK_PROVIDER'] is {setting!r}, which is not a lock provider: {exc}",
                hint="Use 'database', 'memory' or the dotted path of a subclass of "
                "django_scheduling.locking.BaseLockProvider.",
                id="django_scheduling.E004",
            )
        ]
    return []


def describe(messages: Sequence[checks.CheckMessage]) -> str:
    """Return *messages* one to a line, each with its id and hint, for a log or an exception."""
    lines = []
    for message in messages:
        hint = f"\n    HINT: {message.hint}" if message.hint else ""
        lines.append(f"  ({message.id}) {message.msg}{hint}")
    return "\n".join(lines)


def _as_reported_here(errors: list[checks.Error]) -> list[checks.CheckMessage]:
    """Return *errors* as this process reports them: as warnings in commands that do not
    need the scheduler, so that ``runserver`` serves and ``migrate`` migrates."""
    if _command is None or _command in BLOCKING_COMMANDS:
        return list(errors)
    return [
        checks.Warning(
            error.msg,
            hint=f"{error.hint} The scheduler does not start until this is fixed; "
            "`manage.py check` reports it as an error.",
            obj=error.obj,
            id=error.id,
        )
        for error in errors
    ]


def _label(definition: TaskDefinition) -> str:
    """Name the task, and its function when the name does not already say it."""
    if definition.name == definition.origin:
        return repr(definition.name)
    return f"{definition.name!r} ({definition.origin})"
