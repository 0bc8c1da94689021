"""The registry of the tasks declared in code, with the ``@scheduled`` and ``@schedulable``
decorators.

``@scheduled`` records a ``TaskDefinition`` and returns the function unchanged. A definition
whose options are wrong is recorded with its error instead of raising at import: system checks
(``manage.py check``) report it, and the scheduler refuses to start while any is left.
``@schedulable`` records a function that schedules kept in the database may name, without a
schedule of its own.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, tzinfo
from typing import Any, TypeVar, overload

from ..conf import NAME_LENGTH
from ..schedules.durations import DurationLike
from ..schedules.triggers import MissedRuns
from . import engines
from .commands import ManagementCommand
from .configured import configured
from .definition import TaskDefinition, origin_of
from .options import declared, invalid

__all__ = [
    "TaskDefinition",
    "TaskRegistry",
    "registry",
    "scheduled",
    "schedulable",
    "autodiscover",
]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class TaskRegistry:
    """The tasks declared in code, by name."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskDefinition] = {}
        self.duplicates: list[tuple[TaskDefinition, TaskDefinition]] = []
        #: What schedules in the database may name (``@schedulable``), by name.
        self._schedulable: dict[str, Any] = {}
        #: The mistakes of ``@schedulable``: (where, what).
        self.schedulable_errors: list[tuple[str, str]] = []

    def allow(self, target: Any, name: Any = None) -> None:
        """Let schedules in the database name *target* (a function, a django.tasks Task or
        a Celery task) as *name*, by default its dotted path. Never raises: a mistake is kept
        in ``schedulable_errors``, for the system checks to report."""
        origin = _origin_or_repr(target)
        if name is None:
            name = origin
        if not _decoratable(target):
            self.schedulable_errors.append(
                (origin, f"@schedulable marks a function or a task, not {target!r}")
            )
        elif not isinstance(name, str) or not name.strip() or len(name) > 255:
            self.schedulable_errors.append(
                (
                    origin,
                    f"@schedulable(name={name!r}) must be a non-empty string of at most "
                    "255 characters",
                )
            )
        elif (known := self._schedulable.get(name)) is not None and known is not target:
            self.schedulable_errors.append(
                (
                    origin,
                    f"two @schedulable targets are named {name!r}: {_origin_or_repr(known)} "
                    f"and {origin}; give one of them another name='...'",
                )
            )
        else:
            self._schedulable[name] = target

    def shadowing(self) -> list[str]:
        """Return the ``@schedulable`` names that are also the names of tasks of the code."""
        return sorted(name for name in self._schedulable if name in self._tasks)

    def schedulable(self) -> dict[str, Any]:
        """Return what a schedule in the database may name as its task, by name: the
        ``@schedulable`` targets, then the functions of the ``@scheduled`` tasks (not the
        commands of ``SCHEDULING['SCHEDULE']``: those are listed in ``COMMANDS``)."""
        found = {
            definition.name: definition.func
            for definition in self._tasks.values()
            if definition.error is None and not isinstance(definition.func, ManagementCommand)
        }
        found.update(self._schedulable)
        return found

    def add(self, func: Any, **options: Any) -> TaskDefinition:
        """Record *func* as a task declared with *options* (those of ``@scheduled``) and
        return its definition. Never raises: a mistake is kept in the definition's ``error``,
        for the system checks to report."""
        try:
            definition = declared(func, options)
        except Exception as exc:  # a value that breaks a check itself: still a check error
            definition = invalid(
                func,
                _origin_or_repr(func),
                f"@scheduled() could not read its options: {type(exc).__name__}: {exc}",
            )
        return self._keep(definition)

    def add_configured(self, schedule: Mapping[str, Mapping[str, Any]]) -> None:
        """Record the tasks of *schedule*, ``SCHEDULING["SCHEDULE"]``; never raises (see
        ``configured``)."""
        for name, entry in schedule.items():
            self._keep(configured(name, entry))

    def _keep(self, definition: TaskDefinition) -> TaskDefinition:
        existing = self._tasks.get(definition.name)
        # The same name from another function, or twice on one function with other options
        # (two @scheduled lines without distinct names); the same declaration again (a module
        # imported once more) replaces its definition.
        if existing is not None and (
            existing.origin != definition.origin
            or (existing.func is definition.func and existing != definition)
        ):
            self.duplicates.append((existing, definition))
        else:
            self._tasks[definition.name] = definition
        return definition

    def __iter__(self) -> Iterator[TaskDefinition]:
        return iter(sorted(self._tasks.values(), key=lambda d: d.name))

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def get(self, name: str) -> TaskDefinition:
        return self._tasks[name]

    def errors(self) -> list[str]:
        """Return one line per mistake in the declared tasks; empty when all is well."""
        lines = [f"task {d.name!r} ({d.origin}): {d.error}" for d in self if d.error]
        lines += [
            f"two tasks are named {second.name!r}: {first.origin} and {second.origin}; "
            "give one of them another name='...'"
            for first, second in self.duplicates
        ]
        return lines


registry = TaskRegistry()


@overload
def scheduled(func: F, /) -> F: ...  # a bare @scheduled: an error that manage.py check reports


@overload
def scheduled(
    *,
    cron: str | None = None,
    zone: str | tzinfo | None = None,
    fixed_rate: DurationLike | None = None,
    fixed_delay: DurationLike | None = None,
    initial_delay: DurationLike | None = None,
    at: datetime | None = None,
    missed: MissedRuns | str = MissedRuns.COALESCE,
    name: str | None = None,
    lock: bool = True,
    lock_at_most_for: DurationLike | None = None,
    lock_at_least_for: DurationLike | None = None,
    recover: bool = False,
    jitter: DurationLike | None = None,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    expires: DurationLike | bool | None = None,
    timeout: DurationLike | None = None,
    retries: int = 0,
    retry_backoff: DurationLike | None = None,
    retry_backoff_max: DurationLike | None = None,
) -> Callable[[F], F]: ...


def scheduled(*given: Any, **options: Any) -> Any:
    """Declare the decorated function a scheduled task and return it unchanged.

    Give exactly one trigger: ``cron=`` (with an optional ``zone=``), ``fixed_rate=``,
    ``fixed_delay=`` (both with an optional ``initial_delay=``) or ``at=`` (one shot).
    ``args=`` and ``kwargs=`` are the arguments of each call. On a django.tasks ``Task`` or a
    Celery task, each firing enqueues the task instead of calling it; ``expires=`` (Celery
    only) bounds how long its message may wait for a worker: by default until the task's next
    fire time, ``False`` for ever. Several ``@scheduled`` lines with distinct ``name=`` give
    one callable several schedules.

    A mistake (an unknown keyword, a value of the wrong type, a bare ``@scheduled`` without
    parentheses) never raises: the task is recorded with its error, which ``manage.py check``
    reports, and the function is returned unchanged all the same.
    """
    if given:
        if len(given) == 1 and not options and _decoratable(given[0]):
            # A bare @scheduled: the function came where the options should be.
            func = given[0]
            registry._keep(
                invalid(
                    func,
                    _origin_or_repr(func),
                    "@scheduled needs its options in parentheses: write @scheduled(cron=...), "
                    "@scheduled(fixed_rate=...) or @scheduled(fixed_delay=...)",
                )
            )
            return func
        positional = given[0]

        def refuse(func: F) -> F:
            hint = f"; did you mean cron={positional!r}?" if isinstance(positional, str) else ""
            registry._keep(
                invalid(
                    func,
                    _origin_or_repr(func),
                    f"@scheduled() takes options by keyword only, got the positional argument "
                    f"{positional!r}{hint}",
                )
            )
            return func

        return refuse

    def decorate(func: F) -> F:
        registry.add(func, **options)
        return func

    return decorate


@overload
def schedulable(func: F, /) -> F: ...


@overload
def schedulable(*, name: str | None = None) -> Callable[[F], F]: ...


def schedulable(func: Any = None, /, *, name: str | None = None) -> Any:
    """Let schedules kept in the database (``models.Schedule``, the admin) run the decorated
    function, django.tasks Task or Celery task, named *name* (by default its dotted path).
    It gives it no schedule of its own, and returns it unchanged.

    Nothing stored in the database can make the scheduler import or call anything else: a
    schedule names a ``@schedulable`` target, a ``@scheduled`` task's function, or a command
    listed in ``SCHEDULING['COMMANDS']``.
    """

    def mark(target: F) -> F:
        registry.allow(target, name)
        return target

    return mark if func is None else mark(func)


def _decoratable(obj: object) -> bool:
    """Return whether *obj* is what ``@scheduled`` decorates: a function or a task object."""
    return engines.engine_of(obj) is not None or inspect.isroutine(obj) or inspect.isclass(obj)


def _origin_or_repr(func: Any) -> str:
    """Return the dotted path of *func*, or its repr when it has none."""
    try:
        return origin_of(func, engines.engine_of(func))[:NAME_LENGTH]
    except Exception:
        return repr(func)[:NAME_LENGTH]


def autodiscover() -> None:
    """Import the task module (``SCHEDULING['TASK_MODULE']``) of every installed app, then
    record the tasks of ``SCHEDULING['SCHEDULE']``."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.utils.module_loading import autodiscover_modules

    from ..conf import DEFAULTS, get_settings

    schedule: Mapping[str, Mapping[str, Any]] = {}
    try:
        conf = get_settings()
        module, schedule = conf.task_module, conf.schedule
    except ImproperlyConfigured:
        # The system checks report the setting; discover with what can be read of it, and
        # declare none of its schedule (the scheduler does not start meanwhile).
        raw = getattr(settings, "SCHEDULING", None)
        given = raw.get("TASK_MODULE") if isinstance(raw, Mapping) else None
        module = given if isinstance(given, str) and given else DEFAULTS["TASK_MODULE"]
    autodiscover_modules(module)
    registry.add_configured(schedule)
