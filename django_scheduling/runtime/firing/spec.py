"""A task as the firing pipeline keeps it while the scheduler runs: its resolved view, its state
as last known, and what it meets of trouble."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from ...schedules.triggers import Trigger, TriggerState, kept_state, reads_last_finished
from ...tasks.definition import TaskDefinition
from ...tasks.resolved import ResolvedTask
from ..calls import Entry

__all__ = ["TaskSpec", "Remembered"]


@dataclass(slots=True)
class _Trouble:
    """What a task keeps only while it meets trouble: database errors, a lock held elsewhere,
    a newer deployment's trigger, a run longer than ``LOCKED_REPORT_AFTER``. Most tasks never
    need it."""

    database_failures: int = 0  # database errors in a row
    #: A fire time skipped as locked that is looked at again, while it may still be run.
    recheck: datetime | None = None
    locked_since: datetime | None = None
    locked_holder: tuple[datetime, str, datetime] | None = None
    warned_trigger: str | None = None
    #: The longest run of the task, once one ran longer than ``LOCKED_REPORT_AFTER``.
    longest_run: timedelta = timedelta(0)


_NO_TROUBLE = _Trouble()


def _trouble_field(name: str) -> Any:
    """A ``TaskSpec`` attribute kept in its ``_Trouble``, which exists only while one of them
    is set: a task without trouble costs one pointer for all of them.

    A set reads and replaces ``_trouble`` in steps: it relies on the rule that a task's
    firing is handled by one thread at a time (claim thread, pool thread, then the writer's
    callback, while the entry is running); other threads only read.
    """

    def get(spec: TaskSpec) -> Any:
        trouble = spec._trouble
        return getattr(_NO_TROUBLE if trouble is None else trouble, name)

    def set_(spec: TaskSpec, value: Any) -> None:
        trouble = spec._trouble
        if trouble is None:
            if value == getattr(_NO_TROUBLE, name):
                return
            trouble = spec._trouble = _Trouble()
        setattr(trouble, name, value)
        if trouble == _NO_TROUBLE:  # every field back to its default: no trouble left
            spec._trouble = None

    return property(get, set_)


# One per task, for as long as the scheduler runs: the scheduler's entry itself (its payload
# is itself), so that a task costs one object beside its shared resolved options.
@dataclass(eq=False, slots=True, kw_only=True)
class TaskSpec(Entry):
    """A task as the pipeline sees it: its resolved view and its state as last known; it is
    also the task's entry in the scheduler's delay queue."""

    task: ResolvedTask
    #: The state as last known, kept through ``state`` (see ``triggers.kept_state``).
    _state: TriggerState
    _trouble: _Trouble | None = None

    def __post_init__(self) -> None:
        self.payload = self
        self.state = self._state

    @property
    def state(self) -> TriggerState:
        return self._state

    @state.setter
    def state(self, value: TriggerState) -> None:
        # Shared with the tasks in the same state: what a burst leaves is not a state per task.
        self._state = kept_state(self.task.trigger, value)

    def finished(self, at: datetime) -> None:
        """Note that a run of the task ended at *at*, if its trigger counts from there: the
        others keep their shared state (see ``kept_state``)."""
        if reads_last_finished(self.task.trigger):
            self._state = replace(self._state, last_finished=at)

    @property
    def definition(self) -> TaskDefinition:
        return self.task.definition

    @property
    def trigger(self) -> Trigger:
        return self.task.trigger

    @property
    def jitter(self) -> timedelta:
        return self.task.jitter

    @property
    def timeout(self) -> timedelta | None:
        return self.task.timeout

    @property
    def described(self) -> str:
        """The trigger as the row stores it."""
        return self.task.described

    def next_time(
        self, now: datetime, remembered: dict[int, Remembered] | None = None
    ) -> datetime | None:
        """Return when the task is dispatched next, from its state as last known; with
        *remembered*, the batch's triggers answer (see ``Remembered``)."""
        trigger = self.trigger_in(remembered)
        return self.task.dispatch_time(trigger.next_fire_time(now=now, state=self._state))

    def trigger_in(self, remembered: dict[int, Remembered] | None) -> Trigger | Remembered:
        """Return the task's trigger as the batch *remembered* keeps it (itself without one)."""
        return self.trigger if remembered is None else remembered[id(self.task.trigger)]

    database_failures = _trouble_field("database_failures")
    recheck = _trouble_field("recheck")
    locked_since = _trouble_field("locked_since")
    locked_holder = _trouble_field("locked_holder")
    warned_trigger = _trouble_field("warned_trigger")
    longest_run = _trouble_field("longest_run")


class Remembered:
    """A trigger whose answers are remembered for one batch.

    Triggers are pure and shared by the tasks declared alike, and the tasks of a batch are
    decided at one instant: tasks with the same trigger and the same state (the usual case for
    a burst on one cron line) get the same answer, computed once.
    """

    __slots__ = ("_answers", "_missed", "trigger")

    def __init__(self, trigger: Trigger) -> None:
        self.trigger = trigger
        self._answers: dict[tuple[datetime, TriggerState], datetime | None] = {}
        self._missed: dict[tuple[datetime, TriggerState], int] = {}

    def next_fire_time(self, *, now: datetime, state: TriggerState) -> datetime | None:
        key = (now, state)
        try:
            return self._answers[key]
        except KeyError:
            answer = self._answers[key] = self.trigger.next_fire_time(now=now, state=state)
            return answer

    def missed_before(self, due: datetime, *, state: TriggerState) -> int:
        key = (due, state)
        try:
            return self._missed[key]
        except KeyError:
            answer = self._missed[key] = self.trigger.missed_before(due, state=state)
            return answer

    @staticmethod
    def of(specs: list[TaskSpec]) -> dict[int, Remembered]:
        """Return a ``Remembered`` for each distinct trigger of *specs*, by ``id``."""
        remembered: dict[int, Remembered] = {}
        for spec in specs:
            trigger = spec.task.trigger
            if id(trigger) not in remembered:
                remembered[id(trigger)] = Remembered(trigger)
        return remembered
