"""Decide a batch of firings: read their rows in one statement, and ask ``decisions`` what each
firing does.

A firing that does not run here gets its entry's next fire time at once; one that runs (or,
for a paused locked task, a fire time to mark as served) becomes a ``Claim``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from ...schedules.decisions import Firing, Skip, decide, decide_unlocked
from ...storage import batch_rows, task_rows
from .contention import Contention
from .runs import Claim
from .spec import Remembered, TaskSpec

__all__ = ["Decider", "Decided"]


class Decided:
    """What the decision of a batch found: the claims to make, the rows as read (with their
    locks' holders and the database's clock), the instant the batch is decided at, and the
    batch's triggers."""

    __slots__ = ("claims", "found", "instant", "now", "remembered")

    def __init__(
        self,
        claims: list[Claim],
        found: batch_rows.Rows,
        now: datetime,
        instant: datetime,
        remembered: dict[int, Remembered],
    ) -> None:
        self.claims, self.found, self.now = claims, found, now
        self.instant, self.remembered = instant, remembered


class Decider:
    """Read the rows of a batch and decide each of its firings."""

    def __init__(
        self, *, using: str, clock: Callable[[], datetime], contention: Contention
    ) -> None:
        self.using = using
        self.clock = clock
        self.contention = contention

    def decide(self, specs: list[TaskSpec], firings: list[Firing], outcomes: list[Any]) -> Decided:
        """Decide *firings* (of *specs*); set the outcome of those that do not run here."""
        found = self._read_rows(specs)
        now = self.clock()
        # A burst claimed ahead of its instant is decided, claimed and recorded as at that
        # instant: what every instance decides then (see ``scheduler.claim_ahead``).
        instant = max([now, *(firing for firing in firings if isinstance(firing, datetime))])
        remembered = Remembered.of(specs)
        contention = self.contention
        claims: list[Claim] = []
        for index, (spec, firing) in enumerate(zip(specs, firings, strict=True)):
            row = found.rows.get(spec.name)
            ahead = firing if isinstance(firing, datetime) and firing > now else None
            at = ahead or now
            trigger = spec.trigger_in(remembered)
            if spec.definition.lock:
                assert row is not None  # _read_rows made the missing ones again
                spec.state = row.state
                last = row.state.last_fire_time
                if spec.recheck is not None and last is not None and last >= spec.recheck:
                    # Claimed elsewhere since it was found locked.
                    outcomes[index] = contention.settled_elsewhere(
                        spec, last, now=now, remembered=remembered
                    )
                    continue
                decision = decide(trigger, spec.described, row, now=at, firing=firing)  # type: ignore[arg-type]
                if isinstance(decision, Skip):
                    if decision.claim is not None:  # paused: served under its lock, no run
                        claims.append(Claim(index, spec, firing, None, row, decision.claim, ahead))
                    else:
                        outcomes[index] = contention.decided_skip(spec, firing, decision)
                    continue
            else:
                decision = decide_unlocked(trigger, spec.state, row, now=at, firing=firing)  # type: ignore[arg-type]
                if isinstance(decision, Skip):
                    if decision.served is not None:
                        outcomes[index] = contention.skipped_firing(
                            spec, decision.served, decision.reason, assume_ran=True
                        )
                    else:
                        outcomes[index] = contention.decided_skip(spec, firing, decision)
                    continue
                if decision.fire_time is not None and decision.request is None:
                    # Its schedule is this instance's, kept in memory: served from here on.
                    spec.state = replace(spec.state, last_fire_time=decision.fire_time)
            claims.append(Claim(index, spec, firing, decision, row, at=ahead))
        return Decided(claims, found, now, instant, remembered)

    def _read_rows(self, specs: list[TaskSpec]) -> batch_rows.Rows:
        """Read the rows of *specs*, making those of locked tasks again if they were deleted
        while the scheduler ran."""
        found = batch_rows.read_rows([spec.name for spec in specs], using=self.using)
        missing = [spec for spec in specs if spec.definition.lock and spec.name not in found.rows]
        if not missing:
            return found
        for spec in missing:
            task_rows.ensure_row(spec.name, spec.trigger, now=self.clock(), using=self.using)
        again = batch_rows.read_rows([spec.name for spec in missing], using=self.using)
        return batch_rows.Rows(
            found.now, {**found.rows, **again.rows}, {**found.locks, **again.locks}
        )
