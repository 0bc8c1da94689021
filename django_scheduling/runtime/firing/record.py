"""Record runs: their starts, their ends, and what the record finds (a lost lock).

Every end goes to the ``EndWriter``: the history row, the task row when the claim did not say it
all, then the release of the lock, in that order, so that the next holder sees the end. The
writer calls the run back once that is written; only then are the end's signals sent and the
entry scheduled again. A database error keeps the writes in the outbox: the run happened.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError

from ... import signals
from ...models import RunStatus
from ...observability.events import run_events
from ...storage import history, task_rows
from ...storage.history import Start
from ..calls import Done
from ..outbox import Outbox
from ..pool import PoolStats
from ..writer import EndWriter, Finished
from .contention import Contention, when
from .runs import Claim, ClaimedRun, Handed
from .spec import TaskSpec

__all__ = ["Error", "HandOver", "NO_ERROR", "Recorder"]

logger = logging.getLogger(__name__)

#: An error as the history stores it: (exception type, message, traceback).
Error = tuple[str, str, str]
NO_ERROR: Error = ("", "", "")
_REJECTED = "django_scheduling.pool.RejectedWork"
#: A run that failed outside the task fires again this much later.
RETRY_AFTER_ERROR = timedelta(seconds=1)


class Recorder:
    """Record the starts and ends of runs, through the writer and the outbox."""

    def __init__(
        self,
        *,
        using: str,
        instance: str,
        history_on: bool,
        clock: Callable[[], datetime],
        writer: EndWriter,
        outbox: Outbox,
        contention: Contention,
    ) -> None:
        self.using = using
        self.instance = instance
        self.history_on = history_on
        self.clock = clock
        self.writer = writer
        self.outbox = outbox
        self.contention = contention

    # -- starts --------------------------------------------------------------------------------

    def record_starts(self, claims: list[Claim], started: datetime) -> None:
        """Record the starts of *claims* (in the claim's transaction) and give each its run
        id; with the history off, none."""
        if not self.history_on or not claims:
            return
        starts = []
        for claim in claims:
            spec, decision = claim.spec, claim.decision
            assert decision is not None
            request = decision.request
            starts.append(
                Start(
                    spec.name,
                    decision.fire_time,
                    claim.lock.locked_at if claim.lock is not None else None,
                    None if spec.timeout is None else started + spec.timeout,
                    decision.missed,
                    request.recover_run_id if request is not None else None,
                )
            )
        run_ids = history.record_starts(
            using=self.using, instance=self.instance, started=started, runs=starts
        )
        for claim, run_id in zip(claims, run_ids, strict=True):
            claim.run_id = run_id

    def record_attempt_start(self, run: ClaimedRun, started: datetime, attempt: int) -> None:
        """Record the start of a retry of *run* (attempt 2, 3, ...); the run takes its id."""
        if not self.history_on:
            return
        spec = run.spec
        run.run_id = history.record_start(
            using=self.using,
            task_name=spec.name,
            fire_time=run.fire_time,
            started=started,
            instance=self.instance,
            recovery_of=run.recovery_of,
            locked_at=run.locked_at,
            attempt=attempt,
            timeout_at=None if spec.timeout is None else started + spec.timeout,
        )

    def record_handed(self, ends: list[tuple[int, Handed]], started: datetime) -> None:
        """Record the ends of runs enqueued in the claim's transaction, in it."""
        if ends:
            history.record_ends(
                using=self.using,
                ends=[
                    history.Ended(
                        run_id,
                        handed.status,
                        started,
                        handed.finished,
                        handed.error,
                        handed.backend,
                        handed.result_id,
                    )
                    for run_id, handed in ends
                ],
            )

    def forget(self, run_ids: list[int]) -> None:
        """Remove the records of runs that did not run after all (their claims failed)."""
        if not run_ids:
            return
        forget = functools.partial(history.forget_starts, using=self.using, run_ids=run_ids)
        try:
            forget()
        except DatabaseError as exc:
            # Left "running", they would later pass for lost runs, and recover=True would run
            # their fire times again: remove them when the database answers.
            logger.warning("Could not remove the records of runs that did not run yet: %s", exc)
            self.outbox.add(f"the removal of {len(run_ids)} run(s) that did not run", forget)

    # -- ends ----------------------------------------------------------------------------------

    def record_attempt_end(
        self,
        run: ClaimedRun,
        status: RunStatus,
        started: datetime,
        finished: datetime,
        error: Error,
        output: str = "",
    ) -> None:
        """Record the end of an attempt that is tried again (a database error keeps it in the
        outbox: the attempt happened)."""
        if run.run_id is None:
            return
        end = history.Ended(run.run_id, status, started, finished, error, output=output)
        write = functools.partial(history.record_ends, using=self.using, ends=[end])
        try:
            write()
        except DatabaseError as exc:
            logger.error(
                "Could not record attempt %s of %s yet (%s)", run.run_id, run.spec.name, exc
            )
            self.outbox.add(f"the end of run {run.run_id} of {run.spec.name}", write)

    def finish(
        self,
        run: ClaimedRun,
        done: Done,
        *,
        status: RunStatus,
        started: datetime,
        finished: datetime,
        error: Error = NO_ERROR,
        backend: str = "",
        result_id: str = "",
        output: str = "",
    ) -> None:
        """Hand the end of *run* to the writer: its history row (unless the claim's
        transaction wrote it), its task row if the claim did not say it all, then its lock's
        release; ``done`` hears of the entry's next fire time once that is written."""
        spec = run.spec
        next_time = self.next_time(spec, run.planned if run.noted else None, now=finished)
        row_write = None
        if needs_row_write(spec, run.noted, run.planned, next_time):
            row_write = functools.partial(self._write_row, run, finished, next_time)
        end = None
        if run.run_id is not None and not run.recorded:
            end = history.Ended(
                run.run_id, status, started, finished, error, backend, result_id, output
            )
        run.end, run.row_write = end, row_write
        run.done, run.next_time = done, next_time
        run.detach_lock()
        self.writer.add(run)

    def abandon(
        self,
        run: ClaimedRun,
        done: Done,
        started: datetime,
        error: Error,
    ) -> None:
        """Hand the end of *run* to the writer after a failure outside the task (nothing of
        the trigger is trusted): recorded failed, its lock released, its entry tried again in
        a second."""
        end = None
        if run.run_id is not None:
            end = history.Ended(run.run_id, RunStatus.FAILED, started, self.clock(), error)
        run.end, run.row_write = end, None
        run.done, run.next_time = done, self.clock() + RETRY_AFTER_ERROR
        run.detach_lock()
        self.writer.add(run)

    def next_time(
        self, spec: TaskSpec, planned: datetime | None, *, now: datetime
    ) -> datetime | None:
        """Return when the entry of a run that ends at *now* fires next: the time its claim
        planned, while that is ahead (and the trigger does not count from the run's end)."""
        if planned is not None and now < planned and spec.trigger.kind != "fixed_delay":
            return planned
        return spec.next_time(now)

    def _write_row(self, run: ClaimedRun, finished: datetime, next_time: datetime | None) -> None:
        """Store the run's end in its task row, fenced by the fire time the row held once the
        run was taken: a run that lost its lock must not overwrite a newer run's state."""
        spec = run.spec
        stored = task_rows.record_finish(
            spec.name,
            using=self.using,
            seen_fire_time=run.seen,
            finished_at=finished if spec.definition.lock else None,
            next_fire_time=next_time,
            run_id=None if run.claimed else run.run_id,
        )
        # Told once the writer is done (see ``written``): its transaction may roll back.
        run.fenced = not stored and run.claimed

    def written(self, run: ClaimedRun, lost: bool) -> None:
        """The end of *run* is recorded and its lock released: report a lost lock, signal the
        end, and tell the scheduler when the entry fires next."""
        done, exc = run.done, run.exc
        # Nor the exception's traceback, once done; and what the writer needed: the row
        # write refers to the run, a cycle that only the collector would break.
        run.done = run.exc = run.end = run.row_write = run.lock = run.batch_lock = None
        assert done is not None
        try:
            # A newer claim in the row: this run lost its lock to another instance meanwhile,
            # unless a newer deployment's trigger reset the row.
            fenced = run.fenced and not self._trigger_replaced(run.spec)
            if lost or fenced or run.lock_lost:
                self.lock_lost(run.spec, run.run_id, run.fire_time)
            self.signal_end(run, exc)
        finally:
            done(run, run.next_time)

    def signal_end(self, run: ClaimedRun, exc: BaseException | None) -> None:
        spec = run.spec
        common = {"task": spec.definition, "scheduled_at": run.fire_time, "run": run.run_id}
        handed = run.handed
        if handed is not None and exc is None:
            run_events.publish(
                signals.run_enqueued,
                spec.name,
                duration=run.duration,
                backend=handed.backend,
                result_id=handed.result_id,
                **common,
            )
        elif exc is None:
            run_events.publish(signals.run_succeeded, spec.name, duration=run.duration, **common)
        else:
            run_events.publish(
                signals.run_failed, spec.name, exception=exc, duration=run.duration, **common
            )

    def _trigger_replaced(self, spec: TaskSpec) -> bool:
        """Return whether a newer deployment has synced another trigger into the task's row.

        That sync resets the row's fire-time state, which fences out the end of a run under
        way here although the run kept its lock (the unlock tells whether it did).
        """
        row = task_rows.read_row(spec.name, using=self.using)
        if row is None or row.trigger == spec.described:
            return False
        logger.info(
            "The end of %s's run is not stored in its row: another deployment has changed the "
            "task's trigger since it started",
            spec.name,
        )
        return True

    def lock_lost(self, spec: TaskSpec, run_id: int | None, fire_time: datetime | None) -> None:
        """Report a run whose lock expired or was taken over while it ran: flag it, name the
        newer run, and send ``lock_lost``, once: the fenced end of the run and the release of
        its lock can both find the loss."""
        other: int | None = None
        try:
            if run_id is not None and not history.flag_lock_lost(using=self.using, run_id=run_id):
                return  # reported already
            row = task_rows.read_row(spec.name, using=self.using)
            if row is not None and row.last_run_id != run_id:
                other = row.last_run_id
        except DatabaseError:
            if run_id is not None:
                flag = functools.partial(history.flag_lock_lost, using=self.using, run_id=run_id)
                self.outbox.add(f"the lock_lost flag of run {run_id}", flag)
        logger.warning(
            "Run %s of %s (scheduled for %s) lost its lock while it ran: it expired, or another "
            "instance took it over; %s. Raise lock_at_most_for, or look for a frozen process.",
            run_id,
            spec.name,
            when(fire_time),
            f"run {other} may have overlapped it"
            if other
            else "another run may have overlapped it",
        )
        run_events.publish(
            signals.lock_lost,
            spec.name,
            task=spec.definition,
            scheduled_at=fire_time,
            run=run_id,
            other_run=other,
        )

    # -- firings that found no room ------------------------------------------------------------

    def rejected(self, spec: TaskSpec, fire_time: datetime | None, stats: PoolStats) -> None:
        """Record a firing the pool had no room for (before its claim), through the outbox:
        called on the dispatcher thread, which does no I/O."""
        if self.history_on:
            record = functools.partial(
                history.record_rejection,
                using=self.using,
                task_name=spec.name,
                fire_time=fire_time,
                now=self.clock(),
                instance=self.instance,
                reason=f"rejected by the pool: {stats}",
            )
            self.outbox.add(f"the rejection of {spec.name}", record)
        self.contention.signal_skip(spec, fire_time, "rejected")

    def dropped(self, run: ClaimedRun, stats: PoolStats) -> None:
        """Record a claimed run that the pool dropped before it started (``discard_oldest``):
        its record ends rejected, and its lock is released."""
        now = self.clock()
        logger.warning(
            "The pool dropped %s (scheduled for %s) before it started: %s",
            run.spec.name,
            when(run.fire_time),
            stats,
        )
        end = None
        if run.run_id is not None:
            error = (_REJECTED, f"dropped by the pool (discard_oldest): {stats}", "")
            end = history.Ended(run.run_id, RunStatus.REJECTED, now, now, error)
        run.detach_lock()
        self.writer.add(Finished(run.spec.name, end, None, run.lock, _ignore, run.batch_lock))
        self.contention.signal_skip(run.spec, run.fire_time, "rejected")


class HandOver:
    """What hands claimed runs over (``Invoker``, ``Enqueuer``) shares: their ends and their
    drops go to the recorder."""

    def __init__(self, *, recorder: Recorder, underway: Any, clock: Callable[[], datetime]) -> None:
        self.recorder = recorder
        self.underway = underway
        self.clock = clock

    def written(self, run: ClaimedRun, lost: bool) -> None:
        self.recorder.written(run, lost)

    def reject(self, run: ClaimedRun, stats: PoolStats) -> datetime | None:
        self.underway.started(run.spec.name)
        self.recorder.dropped(run, stats)
        return run.spec.next_time(self.clock())


def needs_row_write(
    spec: TaskSpec, noted: bool, planned: datetime | None, next_time: datetime | None
) -> bool:
    """Return whether the end of a run must write its task row: its claim stored the run and
    the planned next fire time (*noted*), so only a fixed-delay task (whose next start counts
    from this end), a run that overran its next fire time, or a run asked for outside the
    schedule needs another write."""
    return spec.trigger.kind == "fixed_delay" or not noted or next_time != planned


def _ignore(lost: bool) -> None:
    pass
