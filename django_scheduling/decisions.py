"""What to do with a firing, given the task's trigger, its stored row and the time: pure.

The runner asks ``decide()`` once it holds the task's lock and has read the row; everything it
does next (claim, run, skip) follows from the answer. No database, no clock: tested with
explicit times.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .scheduler import Firing, RunRequest
from .state import TaskRow
from .triggers import Trigger

__all__ = ["Run", "Skip", "decide", "TRIGGER_CHANGED"]

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
    return Run(due, claim=True)
