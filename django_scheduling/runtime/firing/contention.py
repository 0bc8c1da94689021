"""Firings that do not run here: skips, a lock held elsewhere, and the back-off of a database
outage.

A fire time whose lock is held elsewhere is looked at again while it is within
``MISFIRE_THRESHOLD`` (its holder may die before it claims it), and a lock that stays with the
same holder for longer than the task ever ran is reported. A database that fails makes the
firing back off, its wait doubling with each failure in a row: a locked task never runs without
its lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError

from ... import signals
from ...locking import LockError
from ...observability.events import run_events
from ...schedules.decisions import TRIGGER_CHANGED, Firing, RunRequest, Skip, scheduled_for
from ...storage import task_rows
from .spec import Remembered, TaskSpec

__all__ = ["Contention", "LOCKED_RECHECK", "LOCKED_REPORT_AFTER", "when"]

logger = logging.getLogger(__name__)

_MAX_BACKOFF = 60.0
#: While a fire time is within the misfire threshold and its lock is held elsewhere, look
#: again this often: the holder may have died before claiming it.
LOCKED_RECHECK = timedelta(seconds=1)
#: A lock held elsewhere through a streak of skips longer than this (and than any run of the
#: task here) is looked at, and reported when the same holder still has it.
LOCKED_REPORT_AFTER = timedelta(minutes=1)


class Contention:
    """What becomes of the firings that do not run: counted, signalled, and given their
    entry's next fire time.

    A batch gives the methods that compute a next fire time its clock reading (*now*) and its
    *remembered* triggers: with several instances, most firings of a burst end here, and the
    tasks on one trigger, in one state, then get one answer. Alone, a firing reads the clock.
    """

    def __init__(
        self, *, using: str, misfire_threshold: timedelta, clock: Callable[[], datetime]
    ) -> None:
        self.using = using
        self.misfire_threshold = misfire_threshold
        self.clock = clock
        #: Set when a firing met an unreachable database; the service clears it, and wakes
        #: the entries that back off, once a statement succeeds again.
        self.outage = threading.Event()
        self._mutex = threading.Lock()
        self._skipped = 0

    @property
    def skipped(self) -> int:
        with self._mutex:
            return self._skipped

    def skip(self, spec: TaskSpec, fire_time: datetime | None, reason: str) -> None:
        """Count and signal a firing that does not run here."""
        with self._mutex:
            self._skipped += 1
        if logger.isEnabledFor(logging.DEBUG):  # as ``Invoker``: formats only a line written
            logger.debug("Skipped %s at %s: %s", spec.name, when(fire_time), reason)
        self.signal_skip(spec, fire_time, reason)

    def signal_skip(self, spec: TaskSpec, fire_time: datetime | None, reason: str) -> None:
        run_events.publish(
            signals.run_skipped,
            spec.name,
            task=spec.definition,
            scheduled_at=fire_time,
            run=None,
            reason=reason,
        )

    def settled_elsewhere(
        self,
        spec: TaskSpec,
        last: datetime,
        skipped: datetime | None = None,
        *,
        now: datetime | None = None,
        remembered: dict[int, Remembered] | None = None,
    ) -> datetime | None:
        """Note that another instance claimed the fire time *last* of *spec*, so that this
        one skips *skipped* (by default *last* itself): its schedule moves on from *last*,
        with nothing left to look at again. Return when the entry fires next."""
        spec.state = replace(spec.state, last_fire_time=last)
        spec.recheck = None
        self.skip(spec, last if skipped is None else skipped, "already run")
        return spec.next_time(self.clock() if now is None else now, remembered)

    def skipped_firing(
        self,
        spec: TaskSpec,
        firing: Firing,
        reason: str,
        *,
        assume_ran: bool,
        now: datetime | None = None,
        remembered: dict[int, Remembered] | None = None,
    ) -> datetime | None:
        """Count a skip and return the next fire time, assuming the firing ran elsewhere."""
        fire_time = scheduled_for(firing)
        self.skip(spec, fire_time, reason)
        now = self.clock() if now is None else now
        if assume_ran and fire_time is not None:
            spec.state = replace(spec.state, last_fire_time=fire_time, last_finished=now)
        return spec.next_time(now, remembered)

    def decided_skip(self, spec: TaskSpec, firing: Firing, decision: Skip) -> datetime | None:
        """A firing that ``decide`` skipped (without a fire time to serve): count it, warn
        once about a newer deployment's trigger, and return when the entry fires next."""
        if decision.reason == TRIGGER_CHANGED:
            if spec.warned_trigger != spec.described:
                spec.warned_trigger = spec.described
                logger.warning(
                    "Not running %s: another deployment declared a different trigger for it "
                    "since this process started; the newest deployment's trigger applies. "
                    "Restart this process to apply its own.",
                    spec.name,
                )
            return self.skipped_firing(spec, firing, decision.reason, assume_ran=True)
        self.skip(spec, scheduled_for(firing), decision.reason)
        if isinstance(firing, RunRequest):
            return spec.next_time(self.clock())
        return spec.task.dispatch_time(decision.next_time)

    def locked_elsewhere(
        self,
        spec: TaskSpec,
        firing: Firing,
        holder: task_rows.Holder | None,
        *,
        now: datetime | None = None,
        remembered: dict[int, Remembered] | None = None,
    ) -> datetime | None:
        """The lock is held by another instance (or a process that died); *holder* is the
        lock's row as read with the task's. Return when the entry fires next."""
        now = self.clock() if now is None else now
        spec.database_failures = 0
        self._watch_holder(spec, now, holder)
        if isinstance(firing, RunRequest):
            # The request stays in the row until a run takes it; it is asked again.
            self.skip(spec, None, "locked")
            return spec.next_time(now, remembered)
        fire_time = spec.recheck or self._fire_time_of(spec, firing, now, remembered)
        if now - fire_time <= self.misfire_threshold + spec.jitter:
            # Nobody may have claimed it yet: its holder can die first. Look again soon.
            spec.recheck = fire_time
            self.skip(spec, fire_time, "locked")
            upcoming = spec.task.dispatch_time(
                spec.trigger_in(remembered).next_fire_time(
                    now=now, state=replace(spec.state, last_fire_time=fire_time)
                )
            )
            retry = now + LOCKED_RECHECK
            # Never sooner than that: a next fire time already due would make a busy loop.
            return upcoming if upcoming is not None and now < upcoming < retry else retry
        spec.recheck = None
        return self.skipped_firing(
            spec, fire_time, "locked", assume_ran=True, now=now, remembered=remembered
        )

    def _fire_time_of(
        self,
        spec: TaskSpec,
        woken: datetime,
        now: datetime,
        remembered: dict[int, Remembered] | None,
    ) -> datetime:
        """Return the fire time a firing woken at *woken* serves: earlier by the jitter
        offset, for a task with jitter (a claim elsewhere is compared with the fire time)."""
        if not spec.jitter:
            return woken
        due = spec.trigger_in(remembered).next_fire_time(now=now, state=spec.state)
        return due if due is not None and due <= woken else woken

    def _watch_holder(self, spec: TaskSpec, now: datetime, holder: task_rows.Holder | None) -> None:
        """Warn when the lock stays with the same holder for longer than the task ever ran."""
        if spec.locked_since is None:
            spec.locked_since = now
            return
        if now - spec.locked_since <= max(LOCKED_REPORT_AFTER, spec.longest_run):
            return
        spec.locked_since = now
        if holder is not None and holder == spec.locked_holder:
            logger.warning(
                "%s was skipped: its lock has been held by %s since %s, longer than it ever ran "
                "here. If that process is frozen or gone, the lock frees itself at %s.",
                spec.name,
                holder[1],
                holder[0],
                holder[2],
            )
        spec.locked_holder = holder

    def back_off(self, firings: list[tuple[TaskSpec, Firing]], exc: Exception) -> list[datetime]:
        """Do not run *firings*, which failed together with *exc*; return when each is tried
        again: after a delay that doubles with each failure of its task in a row.

        One log line for the firings with the same wait: an outage fails whole batches, and a
        line per firing was one per task and retry (10,000 tasks: 10,000 ERROR lines, and as
        many events for a log-based error tracker)."""
        if not firings:
            return []
        outage = isinstance(exc, DatabaseError | LockError)
        if outage:
            self.outage.set()
        reason = "database unavailable" if outage else "error"
        waits = []
        by_wait: dict[float, list[tuple[TaskSpec, Firing]]] = {}
        for spec, firing in firings:
            spec.database_failures += 1
            wait = min(2 ** (spec.database_failures - 1), _MAX_BACKOFF)
            waits.append(wait)
            by_wait.setdefault(wait, []).append((spec, firing))
        for wait, group in sorted(by_wait.items()):
            if outage:
                logger.error(
                    "Not running %s: the database is unavailable (%s); trying again in %gs",
                    _which(group),
                    exc,
                    wait,
                )
            else:
                logger.error(
                    "Not running %s: the firing failed outside the task; trying again in %gs",
                    _which(group),
                    wait,
                    exc_info=exc,
                )
        for spec, firing in firings:
            self.signal_skip(spec, scheduled_for(firing), reason)
        now = self.clock()
        return [now + timedelta(seconds=wait) for wait in waits]


def _which(firings: list[tuple[TaskSpec, Firing]]) -> str:
    """Say which firings a log line is about: one by its task and fire time, several by
    their number and first few tasks."""
    if len(firings) == 1:
        spec, firing = firings[0]
        return f"{spec.name} (scheduled for {when(scheduled_for(firing))})"
    names = ", ".join(spec.name for spec, _ in firings[:3])
    more = f" and {len(firings) - 3} more" if len(firings) > 3 else ""
    return f"{len(firings)} firings ({names}{more})"


def when(fire_time: datetime | None) -> str:
    """Say which firing a log line is about."""
    return "now (manual run)" if fire_time is None else fire_time.isoformat()


def holder_of(found: Any, name: str) -> task_rows.Holder | None:
    """Return the holder of *name*'s lock in what ``read_rows`` found."""
    return found.locks.get(name) if found is not None else None
