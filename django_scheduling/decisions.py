"""What to do with a firing, given the task's trigger, its stored row and the time: pure.

The runner asks ``decide()`` once it holds the task's lock and has read the row; everything it
does next (claim, run, skip) follows from the answer. No database, no clock: tested with
explicit times.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .scheduler import Firing, RunRequest
from .state import TaskRow
from .triggers import Trigger

__all__ = ["Run", "Skip", "decide", "retry_delay", "TRIGGER_CHANGED"]

#: The reason of a skip by an instance whose trigger is no longer the row's.
TRIGGER_CHANGED = "trigger changed"


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
    *claim* is a fire time to mark as served without running it (a paused task)."""

    reason: str
    next_time: datetime | None = None
    claim: datetime | None = None


def decide(
    trigger: Trigger, described: str, row: TaskRow, *, now: datetime, firing: Firing
) -> Run | Skip:
    """Decide what the firing *firing* of a task does, under its lock, at *now*.

    *described* is the trigger as this instance declares it; the row holds the trigger of the
    deployment that synced it last. A scheduled firing of another trigger never runs: neither
    a stale fire time of the old trigger nor, for the old deployment, one of the new.
    """
    if isinstance(firing, RunRequest):
        if firing.recover_run_id is not None:
            if row.recover_run_id != firing.recover_run_id:
                return Skip("already recovered")
            return Run(row.recover_fire_time, request=firing)
        if firing.requested_at is not None and row.run_requested_at != firing.requested_at:
            return Skip("already run")
        return Run(None, request=firing)
    if row.trigger and row.trigger != described:
        return Skip(TRIGGER_CHANGED)
    due = trigger.next_fire_time(now=now, state=row.state)
    if due is None or due > now:
        return Skip("already run", next_time=due)
    if row.paused:
        return Skip("paused", claim=due)
    return Run(due, claim=True, missed=trigger.missed_before(due, state=row.state))


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
