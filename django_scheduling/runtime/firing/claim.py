"""Claim a batch of decided firings in one transaction: take their locks, record their runs'
starts, claim their fire times (or take their run requests), and enqueue those whose engine
commits with the claim; then make each claimed firing a ``ClaimedRun``.

All or nothing: a claim that another instance's transaction crosses (a deadlock) is tried once
more, then one firing at a time, where a lock row kept locked elsewhere counts against its own
task only. From the commit on, a claimed firing is this instance's to run; what was claimed and
will not run (a fire time taken meanwhile) has its lock released and its record removed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction

from ...locking import BaseLockProvider, LockError
from ...observability import metrics
from ...storage import batch_rows, task_rows
from ...storage.errors import is_conflict, is_lock_timeout
from ..keepalive import BatchLocks, KeepAlive
from ..writer import EndWriter
from .contention import Contention
from .decide import Decided
from .enqueue import Enqueuer, EnqueueRefused
from .invoke import Invoker, Underway
from .record import Recorder
from .runs import Claim, ClaimedRun
from .spec import Remembered

__all__ = ["Claimer"]

logger = logging.getLogger(__name__)


class Claimer:
    """Claim decided firings, and hand each claimed one to whoever runs it."""

    def __init__(
        self,
        *,
        using: str,
        history_on: bool,
        provider: BaseLockProvider,
        keepalive: KeepAlive | None,
        writer: EndWriter,
        clock: Callable[[], datetime],
        contention: Contention,
        recorder: Recorder,
        invoker: Invoker,
        enqueuer: Enqueuer,
        underway: Underway,
    ) -> None:
        self.using = using
        self.history_on = history_on
        self.provider = provider
        self.keepalive = keepalive
        self.writer = writer
        self.clock = clock
        self.contention = contention
        self.recorder = recorder
        self.invoker = invoker
        self.enqueuer = enqueuer
        self.underway = underway

    def claim(self, decided: Decided, outcomes: list[Any]) -> None:
        """Claim the firings *decided*; set the outcome of each: its ``ClaimedRun``, or when
        its entry fires next."""
        claims = decided.claims
        locks: dict[str, Any] = {}
        for attempt in (1, 2):
            try:
                locks = self._claim_together(decided)
                break
            except EnqueueRefused as refused:
                # One enqueue failed in the database: the others may not.
                if len(claims) == 1:
                    assert refused.__cause__ is not None
                    raise refused.__cause__ from None
                logger.warning(
                    "An enqueue of %s failed (%s): claiming %d firings one at a time",
                    refused,
                    refused.__cause__,
                    len(claims),
                )
                self._one_at_a_time(decided, outcomes)
                return
            except (DatabaseError, LockError) as exc:
                # Another instance's transaction crossed this one (a deadlock): the database
                # rolled this one back, so nothing is taken. Once more at once, rather than
                # back off past the fire time. A lock row kept locked elsewhere (an admin
                # edit, a stuck session) would only be waited for again: one at a time then,
                # where it counts as held elsewhere for its own task only.
                if not is_conflict(exc):
                    raise
                if attempt == 1 and not is_lock_timeout(exc):
                    logger.info(
                        "Claiming %d firings met a concurrent claim; trying again", len(claims)
                    )
                    continue
                if len(claims) == 1:
                    claim = claims[0]
                    holder = decided.found.locks.get(claim.spec.name)
                    outcomes[claim.index] = self.contention.locked_elsewhere(
                        claim.spec, claim.firing, holder
                    )
                    return
                logger.warning(
                    "Claiming %d firings together failed (%s): one at a time", len(claims), exc
                )
                self._one_at_a_time(decided, outcomes)
                return
        try:
            self._settle(decided, locks, outcomes)
        except Exception:
            # After the commit: what was claimed and will not run now must not stay locked.
            unrun = [c for c in claims if not isinstance(outcomes[c.index], ClaimedRun)]
            self.writer.release([c.lock for c in unrun if c.lock is not None])
            self.recorder.forget([c.run_id for c in unrun if c.run_id is not None])
            raise

    def _one_at_a_time(self, decided: Decided, outcomes: list[Any]) -> None:
        """Claim each firing of *decided* alone; one that fails backs off alone."""
        for claim in decided.claims:
            alone = Decided(
                [claim], decided.found, decided.now, decided.instant, decided.remembered
            )
            try:
                self.claim(alone, outcomes)
            except Exception as exc:
                [outcomes[claim.index]] = self.contention.back_off(
                    [(claim.spec, claim.firing)], exc
                )

    def _claim_together(self, decided: Decided) -> dict[str, Any]:
        """Take the locks, record the starts, claim the fire times and enqueue what commits
        with them, in one transaction; return the locks taken, by name."""
        claims = decided.claims
        for claim in claims:  # from a first try that rolled back
            claim.lock = claim.run_id = claim.planned = claim.seen = claim.handed = None
            claim.taken = claim.claimed = claim.noted = False
        locked = [claim for claim in claims if claim.spec.definition.lock]
        configs = [claim.spec.task.lock_configuration() for claim in locked]
        locks: dict[str, Any] = {}
        try:
            with transaction.atomic(using=self.using):
                if configs:
                    absent = {c.name for c in configs if c.name not in decided.found.locks}
                    locks = self.provider.lock_many(
                        configs, now=decided.found.now, absent=absent, joined=True
                    )
                    metrics.locks_attempted([config.name for config in configs], locks)
                    for claim in locked:
                        claim.lock = locks.get(claim.spec.name)
                won = [c for c in claims if c.lock is not None or not c.spec.definition.lock]
                if won:
                    started = max(self.clock(), decided.instant)
                    self.recorder.record_starts([c for c in won if c.serve is None], started)
                    self._take(won, started, decided.remembered)
                    to_enqueue = [
                        claim
                        for claim in won
                        if claim.taken
                        and claim.serve is None
                        and claim.spec.definition.engine is not None
                        and self.enqueuer.commits_with(claim.spec)
                    ]
                    if to_enqueue:
                        self.enqueuer.enqueue_claimed(to_enqueue, started)
        except BaseException:
            if locks and not self.provider.supports_batches:
                # Its locks took effect at once, and nothing else did: release them.
                self.writer.release(list(locks.values()))
            raise
        return locks

    def _take(self, won: list[Claim], started: datetime, remembered: dict[int, Remembered]) -> None:
        """Take the runs of *won*, whose locks are held: claim the fire times of scheduled
        firings (one statement per distinct fire time), take run requests and recoveries, and
        serve paused fire times. Set ``taken`` on those that are this instance's."""
        scheduled: list[Claim] = []
        unlocked: list[Claim] = []
        for claim in won:
            decision, row = claim.decision, claim.row
            claim.seen = row.state.last_fire_time if row is not None else None
            if claim.serve is not None:  # paused: the fire time is served without a run
                claim.taken = task_rows.claim(
                    claim.spec.name,
                    claim.serve,
                    using=self.using,
                    trigger=claim.spec.described,
                    run_id=None,
                    next_fire_time=None,
                )
                continue
            assert decision is not None
            request = decision.request
            if decision.claim:
                scheduled.append(claim)
            elif request is not None and request.recover_run_id is not None:
                claim.taken = task_rows.take_recovery(
                    claim.spec.name, request.recover_run_id, using=self.using
                )
            elif request is not None and request.requested_at is not None:
                claim.taken = task_rows.take_run_request(
                    claim.spec.name, request.requested_at, using=self.using
                )
            else:
                claim.taken = True  # lock=False, or a run asked for in this process
                if decision.fire_time is not None and request is None:
                    unlocked.append(claim)
        if scheduled:
            self._claim_fire_times(scheduled, started, remembered)
        if unlocked:
            self._note_runs(unlocked, started, remembered)

    def _note_runs(
        self, claims: list[Claim], started: datetime, remembered: dict[int, Remembered]
    ) -> None:
        """Store the runs of *claims* (scheduled firings of tasks with ``lock=False``, whose
        state this instance keeps) and their next fire times in their rows, in one statement,
        as a claim does: their ends then need no write of the row."""
        for claim in claims:
            spec = claim.spec
            trigger = spec.trigger_in(remembered)
            claim.planned = spec.task.dispatch_time(
                trigger.next_fire_time(now=started, state=spec.state)
            )
            claim.noted = True
        batch_rows.note_runs(
            [(claim.spec.name, claim.run_id, claim.planned) for claim in claims], using=self.using
        )

    def _claim_fire_times(
        self, claims: list[Claim], started: datetime, remembered: dict[int, Remembered]
    ) -> None:
        """Claim the fire times of *claims*, one statement per distinct fire time."""
        groups: dict[datetime, list[tuple[str, str, int | None, datetime | None]]] = {}
        by_name: dict[str, Claim] = {}
        for claim in claims:
            spec, fire_time = claim.spec, claim.fire_time
            assert fire_time is not None
            after = replace(spec.state, last_fire_time=fire_time)
            trigger = spec.trigger_in(remembered)
            claim.planned = spec.task.dispatch_time(
                trigger.next_fire_time(now=started, state=after)
            )
            by_name[spec.name] = claim
            groups.setdefault(fire_time, []).append(
                (spec.name, spec.described, claim.run_id, claim.planned)
            )
        for fire_time, rows in groups.items():
            if not self.history_on:
                # No run id to tell this instance's claims from another's afterwards: claim
                # only the rows found claimable, locked until the commit.
                open_rows = batch_rows.claimable(fire_time, rows, using=self.using)
                rows = [row for row in rows if row[0] in open_rows]
            count = batch_rows.claim_many(fire_time, rows, using=self.using)
            if count == len(rows):
                mine = {name for name, _, _, _ in rows}
            else:
                # Some were claimed first by another instance, or their trigger was replaced
                # by a newer deployment. The run id written by the claim tells which are this
                # one's. (With the history off the claimable rows were locked first: this
                # cannot happen; if it did, a row at this fire time would not be counted as
                # this instance's.)
                found = batch_rows.read_claims([name for name, _, _, _ in rows], using=self.using)
                mine = set()
                for name, _, run_id, _ in rows:
                    if run_id is not None and found.get(name) == (fire_time, run_id):
                        mine.add(name)
                    elif run_id is None and count and found.get(name, (None,))[0] == fire_time:
                        logger.warning(
                            "Not running %s (scheduled for %s): its claim cannot be told from "
                            "another instance's with the history off",
                            name,
                            fire_time,
                        )
            for name in mine:
                claim = by_name[name]
                claim.taken = claim.claimed = claim.noted = True
                claim.seen = fire_time

    def _settle(self, decided: Decided, locks: dict[str, Any], outcomes: list[Any]) -> None:
        """After the commit: make each taken run a ``ClaimedRun``; give the others their next
        fire time, releasing what they hold."""
        contention = self.contention
        claims = decided.claims
        meanwhile = self._claimed_meanwhile([c for c in claims if c.spec.definition.lock], locks)
        # One instant for the batch's outcomes: its tasks on one trigger share their answers.
        now, remembered = self.clock(), decided.remembered
        unrun_locks, unrun_ids = [], []
        runs: list[Claim] = []
        for claim in claims:
            spec, firing = claim.spec, claim.firing
            if spec.definition.lock and claim.lock is None:
                if spec.name in meanwhile:
                    # Its lock and its fire time went to another instance after the row was
                    # read.
                    outcomes[claim.index] = contention.settled_elsewhere(
                        spec,
                        meanwhile[spec.name],
                        claim.fire_time,
                        now=now,
                        remembered=remembered,
                    )
                else:
                    holder = decided.found.locks.get(spec.name)
                    outcomes[claim.index] = contention.locked_elsewhere(
                        spec, firing, holder, now=now, remembered=remembered
                    )
                continue
            if spec.definition.lock:
                spec.recheck = spec.locked_since = spec.locked_holder = None
            if claim.serve is not None or not claim.taken:
                if claim.lock is not None:
                    unrun_locks.append(claim.lock)
                if claim.run_id is not None:
                    unrun_ids.append(claim.run_id)
                if claim.serve is not None and claim.taken:
                    spec.state = replace(spec.state, last_fire_time=claim.serve)
                    contention.skip(spec, claim.serve, "paused")
                else:
                    contention.skip(spec, claim.fire_time, "already run")
                outcomes[claim.index] = spec.next_time(now, remembered)
                continue
            if claim.claimed:
                spec.state = replace(spec.state, last_fire_time=claim.fire_time)
            runs.append(claim)
        # One keep-alive record for the locks of the batch until each run ends.
        locked_runs = [claim for claim in runs if claim.lock is not None]
        batch_locks = None
        if locked_runs:
            batch_locks = BatchLocks([c.lock for c in locked_runs], self.keepalive)  # type: ignore[misc]
        slots = {id(claim): slot for slot, claim in enumerate(locked_runs)}
        claimed = []
        for claim in runs:
            spec = claim.spec
            handler = self.invoker if spec.definition.engine is None else self.enqueuer
            ahead = self.enqueuer.publishes_ahead(spec)  # Celery: an enqueued task
            run = ClaimedRun(handler, claim, batch_locks, slots.get(id(claim), -1), ahead=ahead)
            claimed.append(run)
            outcomes[claim.index] = run
        self.underway.add_claimed(claimed)
        if unrun_locks:
            self.writer.release(unrun_locks)
        self.recorder.forget(unrun_ids)

    def _claimed_meanwhile(self, locked: list[Claim], locks: dict[str, Any]) -> dict[str, datetime]:
        """Return the last fire times of the firings of *locked* whose lock was not taken
        because another instance claimed them since their rows were read (in one statement).

        Instances claiming the same burst meet this way; without a look at the rows, each such
        firing would be looked at again a second later (see ``Contention.locked_elsewhere``).
        """
        missed = {
            c.spec.name: c.fire_time
            for c in locked
            if c.spec.name not in locks
            and c.serve is None
            and c.decision is not None
            and c.decision.claim
        }
        if not missed:
            return {}
        try:
            claims = batch_rows.read_claims(list(missed), using=self.using)
        except DatabaseError as exc:
            # After the commit: the claimed firings must still start. These are looked at
            # again, as any firing found locked is.
            logger.warning(
                "Could not read the rows of %d firings found locked: %s", len(missed), exc
            )
            return {}
        taken = {}
        for name, fire_time in missed.items():
            last = claims.get(name, (None, None))[0]
            if last is not None and fire_time is not None and last >= fire_time:
                taken[name] = last
        return taken
