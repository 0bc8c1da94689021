"""What a task is, as declared: ``TaskDefinition`` and the options it shares with the tasks
declared alike (``TaskOptions``)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta, tzinfo
from typing import Any

from ..schedules.triggers import DEFAULT_MISFIRE_THRESHOLD, Trigger, make_trigger
from . import engines

__all__ = ["TaskDefinition", "TaskOptions", "origin_of"]


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """The options of a task besides its name, function, trigger and arguments. Immutable, and
    one object for the tasks declared alike (see ``TaskDefinition``)."""

    lock: bool = True
    lock_at_most_for: timedelta | None = None
    lock_at_least_for: timedelta | None = None
    error: str | None = None
    error_field: str | None = None
    #: Run a lost run of this task again, once, on another instance.
    recover: bool = False
    #: Delay each firing by a deterministic offset in [0, jitter); None: the setting's JITTER.
    jitter: timedelta | None = None
    #: ``engines.DJANGO_TASKS`` or ``engines.CELERY`` when each firing enqueues *func*.
    engine: str | None = None
    #: Celery only: how long a message may wait for a worker; None: until the next fire time;
    #: False: forever.
    expires: timedelta | bool | None = None
    #: A run longer than this is reported as timed out; None: the setting's TIMEOUT.
    timeout: timedelta | None = None
    #: How many times a failed in-process run is tried again for the same fire time.
    retries: int = 0
    #: The wait before the first retry, doubled for each next one, up to ``retry_backoff_max``.
    retry_backoff: timedelta = timedelta(seconds=1)
    retry_backoff_max: timedelta = timedelta(minutes=10)
    #: Where a task not declared by ``@scheduled`` on its function was declared (an entry of
    #: ``SCHEDULING["SCHEDULE"]``); None: the function's dotted path says it.
    declared_in: str | None = None


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    """A task as declared in code: the function (or the django.tasks / Celery task that each
    firing enqueues), its trigger options, the arguments of each call and its other options.

    One per task for as long as the process runs: what tasks declared alike have in common
    (the trigger's options, ``options``) is one object shared by them all.
    """

    name: str
    func: Any
    #: The trigger's options as declared; one dict is shared by the tasks declared alike, so
    #: it is read, never changed.
    trigger_options: dict[str, Any] = field(hash=False)
    #: The arguments of each call (or enqueue).
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    options: TaskOptions = TaskOptions()

    # The options, read as the definition's own (they live in the shared ``options``).

    @property
    def lock(self) -> bool:
        return self.options.lock

    @property
    def lock_at_most_for(self) -> timedelta | None:
        return self.options.lock_at_most_for

    @property
    def lock_at_least_for(self) -> timedelta | None:
        return self.options.lock_at_least_for

    @property
    def error(self) -> str | None:
        return self.options.error

    @property
    def error_field(self) -> str | None:
        return self.options.error_field

    @property
    def recover(self) -> bool:
        return self.options.recover

    @property
    def jitter(self) -> timedelta | None:
        return self.options.jitter

    @property
    def engine(self) -> str | None:
        return self.options.engine

    @property
    def expires(self) -> timedelta | bool | None:
        return self.options.expires

    @property
    def timeout(self) -> timedelta | None:
        return self.options.timeout

    @property
    def retries(self) -> int:
        return self.options.retries

    @property
    def retry_backoff(self) -> timedelta:
        return self.options.retry_backoff

    @property
    def retry_backoff_max(self) -> timedelta:
        return self.options.retry_backoff_max

    @property
    def is_async(self) -> bool:
        return self.engine is None and inspect.iscoroutinefunction(self.func)

    @property
    def origin(self) -> str:
        return self.options.declared_in or origin_of(self.func, self.engine)

    def trigger(
        self, default_zone: tzinfo, misfire_threshold: timedelta = DEFAULT_MISFIRE_THRESHOLD
    ) -> Trigger:
        """Return this task's trigger; a cron task without ``zone=`` uses *default_zone*.

        Tasks declared alike get the same trigger object: triggers are immutable.
        """
        return make_trigger(
            **self.trigger_options,
            default_zone=default_zone,
            misfire_threshold=misfire_threshold,
        )


def origin_of(func: Any, engine: str | None) -> str:
    """Return the dotted path of the function behind *func* (a task object's own class lives
    in ``django.tasks.base`` or ``celery.local``, which says nothing of the task)."""
    function = engines.function_of(func, engine)
    if function is None:
        return f"{engine} task {getattr(func, 'name', '?')}"
    # A callable object has no name of its own: its class names it.
    module = getattr(function, "__module__", None) or type(function).__module__
    qualname = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{module}.{qualname}"
