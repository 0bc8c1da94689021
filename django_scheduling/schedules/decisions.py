"""What to do with a firing, given the task's trigger, its stored row and the time: pure.

The firing path asks ``decide()`` (``decide_unlocked()`` for a task with ``lock=False``) once
it has read the task's row; everything it does next (claim, run, skip) follows from the
answer. No database, no clock: tested with explicit times. The values it reads and answers
with are defined here: the row (``TaskRow``), a run asked for outside the schedule
(``RunRequest``), and the answers (``Run``, ``Skip``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .triggers import Trigger, TriggerState

__all__ = [
    "Firing",
    "Run",
    "RunRequest",
    "Skip",
    "TaskRow",
    "TRIGGER_CHANGED",
    "decide",
    "decide_unlocked",
    "retry_delay",
    "scheduled_for",
]

#: The reason of a skip by an instance whose trigger is no longer the row's.
TRIGGER_CHANGED = "trigger changed"


@dataclass(frozen=True, slots=True)
class RunRequest:
    """A run asked for outside the schedule: "run now" (made at *requested_at*, ``None`` when
    asked in-process), or the recovery of lost run *recover_run_id*."""

    requested_at: datetime | None = None
    recover_run_id: int | None = None


#: What a firing is for: a fire time of the schedule, or a run asked for outside it.
Firing = datetime | RunRequest


def scheduled_for(firing: Firing) -> datetime | None:
    """Return the fire time *firing* serves: ``None`` for a run asked for outside the
    schedule."""
    return firing if isinstance(firing, datetime) else None


@dataclass(frozen=True, slots=True)
class TaskRow:
    """What the firing path reads of a task's row before a firing."""

    state: TriggerState
    paused: bool
    #: The trigger of the deployment that synced the row last, in words.
    trigger: str = ""
    run_requested_at: datetime | None = None
    last_run_id: int | None = None
    #: A lost run waiting to be run again (``recover=True``), and the fire time it served.
    recover_run_id: int | None = None
    recover_fire_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """Run the task now, serving *fire_time* (``None``: a manual run).

    *claim*: move the row's last fire time to *fire_time* first. *request* is the run request
    to take (clear) first, when the run was asked for.
    """

    fire_time: datetime | None
    claim: bool = False
    request: RunRequest | None = None
    #: Fire times that passed without a run just before *fire_time* (coalesced or skipped).
    missed: int = 0


@dataclass(frozen=True, slots=True)
class Skip:
    """Do not run. *next_time* is when the entry fires next, if the decision knows it;
    *claim* is a fire time to mark as served without running it (a paused locked task, in its
    row), *served* one served in memory only (a paused task with ``lock=False``)."""

    reason: str
    next_time: datetime | None = None
    claim: datetime | None = None
    served: datetime | None = None


def decide(
    trigger: Trigger, described: str, row: TaskRow, *, now: datetime, firing: Firing
) -> Run | Skip:
    """Decide what the firing *firing* of a locked task does at *now*, from its row.

    *described* is the trigger as this instance declares it; the row holds the trigger of the
    deployment that synced it last. A scheduled firing of another trigger never runs: neither
    a stale fire time of the old trigger nor, for the old deployment, one of the new.
    """
    if isinstance(firing, RunRequest):
        return _requested(row, firing)
    if row.trigger and row.trigger != described:
        return Skip(TRIGGER_CHANGED)
    due = trigger.next_fire_time(now=now, state=row.state)
    if due is None or due > now:
        return Skip("already run", next_time=due)
    if row.paused:
        return Skip("paused", claim=due)
    return Run(due, claim=True, missed=trigger.missed_before(due, state=row.state))


def decide_unlocked(
    trigger: Trigger, state: TriggerState, row: TaskRow | None, *, now: datetime, firing: Firing
) -> Run | Skip:
    """Decide what the firing *firing* of a task with ``lock=False`` does at *now*.

    Such a task runs on every instance, each on its own schedule: *state* is this instance's,
    kept in memory. The row (when there is one) says whether the task is paused, and holds
    the requests for a run, which one instance takes. A paused fire time counts as served.
    """
    if isinstance(firing, RunRequest):
        return Run(None, request=firing) if row is None else _requested(row, firing)
    due = trigger.next_fire_time(now=now, state=state)
    if due is None or due > now:  # woken early (after a back-off)
        return Skip("already run", next_time=due)
    if row is not None and row.paused:
        return Skip("paused", served=due)
    return Run(due)


def _requested(row: TaskRow, firing: RunRequest) -> Run | Skip:
    """Decide a run asked for outside the schedule: run it, unless it was taken meanwhile."""
    if firing.recover_run_id is not None:
        if row.recover_run_id != firing.recover_run_id:
            return Skip("already recovered")
        return Run(row.recover_fire_time, request=firing)
    if firing.requested_at is not None and row.run_requested_at != firing.requested_at:
        return Skip("already run")
    return Run(None, request=firing)


def retry_delay(
    attempt: int, backoff: timedelta, backoff_max: timedelta, fraction: float
) -> timedelta:
    """Return how long to wait before trying again after failed attempt *attempt* (1, 2, ...).

    The wait doubles with each attempt from *backoff*, up to *backoff_max*, and is then
    shortened by up to half at random (*fraction*, in [0, 1)), so that tasks that failed
    together do not all try again at the same instant.
    """
    full = min(backoff * 2 ** (attempt - 1), backoff_max)
    return full * (1 - fraction / 2)
