"""One resolved view of a task: its definition with the project's settings applied.

The trigger (with ``MISFIRE_THRESHOLD`` and the jitter, in the project's time zone), the
jitter, the timeout and the lock's times are worked out here, once, and read by everyone who
needs them: the scheduler, ``runscheduler --list``, the admin, the timeline and Sentry Crons.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

from ..conf import SchedulingSettings
from ..locking.base import LockConfiguration
from ..schedules.triggers import Trigger, jitter_offset
from . import engines
from .definition import TaskDefinition

__all__ = ["Applied", "ResolvedTask", "resolve"]

#: The longest a stored trigger description is (the column's length).
DESCRIPTION_LENGTH = 255


@dataclass(frozen=True, slots=True)
class Applied:
    """What the settings make of a task's options: one object for the tasks declared alike
    (their triggers are shared already)."""

    trigger: Trigger
    jitter: timedelta
    timeout: timedelta | None
    lock_at_most_for: timedelta
    lock_at_least_for: timedelta


@dataclass(frozen=True, slots=True)
class ResolvedTask:
    """A task as it runs here: its definition, and what the settings make of it."""

    definition: TaskDefinition
    applied: Applied

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def trigger(self) -> Trigger:
        return self.applied.trigger

    @property
    def jitter(self) -> timedelta:
        return self.applied.jitter

    @property
    def timeout(self) -> timedelta | None:
        return self.applied.timeout

    @property
    def locked(self) -> bool:
        return self.definition.lock

    @property
    def engine(self) -> str | None:
        return self.definition.engine

    @property
    def described(self) -> str:
        """The trigger as the task's row stores it (and claims compare it)."""
        return self.applied.trigger.describe()[:DESCRIPTION_LENGTH]

    def dispatch_time(self, fire_time: datetime | None) -> datetime | None:
        """Return when the firing at *fire_time* is dispatched: later by the task's jitter
        offset, the same on every instance."""
        if fire_time is None or not self.applied.jitter:
            return fire_time
        return fire_time + jitter_offset(self.definition.name, fire_time, self.applied.jitter)

    def lock_configuration(self) -> LockConfiguration:
        """Return the configuration of the task's lock (built when the lock is taken, rather
        than kept per task)."""
        applied = self.applied
        return LockConfiguration(
            self.definition.name, applied.lock_at_most_for, applied.lock_at_least_for
        )


#: The applied options of the tasks resolved so far, kept once per distinct value.
_APPLIED: dict[Applied, Applied] = {}
_APPLIED_SIZE = 1024


def resolve(
    definition: TaskDefinition, conf: SchedulingSettings, default_zone: tzinfo
) -> ResolvedTask:
    """Return *definition* as it runs with the settings *conf*, a cron task without ``zone=``
    on the wall clock of *default_zone*."""
    options = definition.options
    jitter = conf.jitter if options.jitter is None else options.jitter
    # A firing dispatched up to *jitter* after its fire time is late by design, not missed.
    trigger = definition.trigger(default_zone, conf.misfire_threshold + jitter)
    most = options.lock_at_most_for or conf.lock_at_most_for
    least = options.lock_at_least_for
    if least is None:
        least = min(conf.lock_at_least_for, most)
    applied = Applied(trigger, jitter, timeout_of(definition, conf), most, least)
    if len(_APPLIED) >= _APPLIED_SIZE:
        _APPLIED.clear()  # the tasks keep the objects they hold
    return ResolvedTask(definition, _APPLIED.setdefault(applied, applied))


def timeout_of(definition: TaskDefinition, conf: SchedulingSettings) -> timedelta | None:
    """Return the timeout of *definition*'s runs: its ``timeout=``, else ``TIMEOUT``, which a
    django.tasks Task does not take (the framework has no time limit)."""
    if definition.timeout is not None:
        return definition.timeout
    return None if definition.engine == engines.DJANGO_TASKS else conf.timeout
