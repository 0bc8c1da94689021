"""Run firings: lock, decide, claim, call, record, release.

Scheduled firings of locked tasks that fall due together take ``run_batch``: one read of their
rows (with their lock rows and the database's clock), ``decisions.decide`` for each, then one
transaction that takes the free locks, records the runs and claims the fire times. Each claimed
firing becomes a ``Call`` that the scheduler runs on the pool; its end goes to the
``writer.EndWriter``, which records it and releases the lock. Everything else (run requests,
recoveries, ``lock=False`` tasks, a paused task's fire time) takes ``run``, one firing at a
time; the batch path follows the same steps and the same rules.

The path of one firing of a locked task, top to bottom:

1. ``_run_locked`` takes the task's lock. Held elsewhere: skip, and look again while the fire
   time is still within ``MISFIRE_THRESHOLD`` (the holder may have died without claiming it).
   Database unreachable: do not run (fail closed), back off.
2. Under the lock it reads the task's row, and ``decisions.decide`` says what to do: run this
   fire time, or skip (already run elsewhere, paused, trigger changed by a newer deployment).
3. ``_execute`` records the run, claims the fire time (a conditional update: the row count
   says who runs it), calls the task while ``KeepAlive`` extends the lock, records the outcome
   (fenced by the claim, so a run that lost its lock cannot overwrite a newer run's state),
   and the lock is released. From the claim on, the run has happened: a database error after
   it is "could not record", kept in the outbox until the database takes it, never "did not
   run".

A task with ``lock=False`` runs on every instance and keeps its schedule in memory. Every
next fire time comes from ``_next()``.

A django.tasks ``Task`` or a Celery task takes ``run``, one firing at a time: ``_enqueue``
takes the place of ``_execute``'s call and enqueues the task, in the transaction of the claim
when the engine writes to the scheduler's database (``engines.commits_with``), right after it
otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import random
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, close_old_connections, transaction
from django.utils import timezone, translation

from . import signals
from .clock import utcnow
from .conf import SchedulingSettings
from .context import EnqueuedTooLate, RunTimedOut, current_fire_time, firing_context
from .keepalive import KeepAlive, KeptAliveLock, WaitingLocks
from .locking import LockConfiguration, LockError, LockProvider
from .models import RunStatus
from .observability import metrics
from .observability.events import run_events
from .outbox import Outbox
from .pool import PoolStats
from .scheduler import SINGLE, Call, Entry, Firing, Outcome, RunRequest
from .schedules.decisions import TRIGGER_CHANGED, Run, Skip, decide, retry_delay
from .schedules.durations import format_duration
from .schedules.triggers import Trigger, TriggerState, jitter_offset, kept_state
from .storage import history, task_rows
from .storage.connections import KeptConnection
from .storage.errors import is_conflict
from .tasks import engines
from .tasks.registry import TaskDefinition
from .tasks.resolved import timeout_of
from .writer import EndWriter, Finished

__all__ = ["TaskSpec", "TaskRunner", "current_fire_time"]

logger = logging.getLogger(__name__)

_MAX_BACKOFF = 60.0
#: While a fire time is within the misfire threshold and its lock is held elsewhere, look
#: again this often: the holder may have died before claiming it.
LOCKED_RECHECK = timedelta(seconds=1)
#: A lock held elsewhere through a streak of skips longer than this (and than any run of the
#: task here) is looked at, and reported when the same holder still has it.
LOCKED_REPORT_AFTER = timedelta(minutes=1)
#: A publish that fails is tried again after this long, doubling up to ``PUBLISH_BACKOFF_MAX``,
#: until the firing's deadline; without one (a fixed delay, a manual run), for this long.
PUBLISH_BACKOFF = timedelta(milliseconds=500)
PUBLISH_BACKOFF_MAX = timedelta(seconds=10)
PUBLISH_RETRY_FOR = timedelta(minutes=1)


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


_NO_TROUBLE = _Trouble()


# One per task, for as long as the scheduler runs: the scheduler's entry itself (its payload
# is itself), so that a task costs one object.
@dataclass(eq=False, slots=True, kw_only=True)
class TaskSpec(Entry):
    """A task as the runner sees it: definition, trigger, and its state as last known; it is
    also the task's entry in the scheduler's delay queue."""

    definition: TaskDefinition
    trigger: Trigger
    #: The state as last known, kept through ``state`` (see ``triggers.kept_state``).
    _state: TriggerState
    #: Each firing waits a deterministic offset in [0, jitter) after its fire time.
    jitter: timedelta = timedelta(0)
    #: A run longer than this is reported as timed out (``timeout=``, or ``TIMEOUT``).
    timeout: timedelta | None = None
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
        self._state = kept_state(self.trigger, value)

    @property
    def described(self) -> str:
        """The trigger as the row stores it (triggers keep their description)."""
        return task_rows.describe(self.trigger)

    database_failures = _trouble_field("database_failures")
    recheck = _trouble_field("recheck")
    locked_since = _trouble_field("locked_since")
    locked_holder = _trouble_field("locked_holder")
    warned_trigger = _trouble_field("warned_trigger")
    longest_run = _trouble_field("longest_run")


_NO_TIME = timedelta(0)


class _ClaimedRun(Call):
    """A firing claimed in a batch, from its claim to the record of its end: ``run(done)``
    runs it on a worker thread and hands its end to the writer, which calls it back with
    whether the lock was lost. One object all along: a burst claimed ahead keeps thousands at
    once. Until it starts, its lock waits with the batch's (``waiting``, at ``slot``)."""

    __slots__ = (
        "done",
        "duration",
        "exc",
        "fire_time",
        "held",
        "next_time",
        "planned",
        "run_id",
        "runner",
        "slot",
        "spec",
        "waiting",
    )

    def __init__(
        self,
        runner: TaskRunner,
        spec: TaskSpec,
        fire_time: datetime | None,
        run_id: int | None,
        waiting: WaitingLocks,
        slot: int,
        planned: datetime | None,
        at: datetime | None,
    ) -> None:
        super().__init__(at)
        self.runner, self.spec, self.fire_time = runner, spec, fire_time
        self.run_id, self.planned = run_id, planned
        self.waiting: WaitingLocks | None = waiting
        self.slot = slot
        #: Its lock, kept alive on its own, once the run starts (see ``take_lock()``).
        self.held: KeptAliveLock | None = None
        # Set when the run has ended, for the writer's call back:
        self.done: Callable[[datetime | None], None] | None = None
        self.next_time: datetime | None = None
        self.duration = _NO_TIME
        self.exc: BaseException | None = None

    def take_lock(self) -> KeptAliveLock:
        """Return the run's lock, kept alive on its own from now on."""
        if self.held is None:
            assert self.waiting is not None
            self.held, self.waiting = self.waiting.start(self.slot), None
        return self.held

    def run(self, done: Callable[[datetime | None], None]) -> None:
        self.runner._run_claimed(self, done)

    def __call__(self, lost: bool) -> None:
        self.runner._claimed_written(self, lost)


@dataclass(slots=True)
class _Running:
    """A run under way on a worker thread of this process."""

    run_id: int | None
    held: KeptAliveLock | None
    #: When it passes its timeout, on the ``time.monotonic()`` clock; None: no timeout.
    deadline: float | None = None
    timeout: timedelta | None = None
    #: Its timeout has been reported (``watch_timeouts``).
    reported: bool = False
    #: When it started, on the ``time.monotonic()`` clock.
    begun: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class _Ended:
    """How a run (its last attempt) ended: its status, error (type, message, traceback),
    duration, exception and finish, the id and start of its record, and whether a shutdown
    stopped its retries."""

    status: RunStatus
    error: tuple[str, str, str]
    duration: timedelta
    exc: BaseException | None
    finished: datetime
    run_id: int | None
    started: datetime
    retry_stopped: bool = False


class _Remembered:
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


class TaskRunner:
    """Run firings for the scheduler against the database and a lock provider."""

    def __init__(
        self,
        *,
        conf: SchedulingSettings,
        provider: LockProvider,
        default_zone: Any,
        clock: Any = utcnow,
        keepalive: KeepAlive | None = None,
        outbox: Outbox | None = None,
        writer: EndWriter | None = None,
    ) -> None:
        self.conf = conf
        self.provider = provider
        self.default_zone = default_zone
        self.clock = clock
        self.using = conf.database
        self.keepalive = keepalive
        self.outbox = outbox if outbox is not None else Outbox()
        #: Records the ends of the runs claimed in batches; without one, every firing goes
        #: through ``run()``, one at a time.
        self.writer = writer
        self._claims_connection = KeptConnection(self.using)
        # Pool threads' connections for firings that only enqueue (no task code runs here).
        self._enqueue_connection = KeptConnection(self.using)
        #: Set when a firing met an unreachable database; the service clears it, and wakes
        #: the entries that back off, once a statement succeeds again.
        self.outage = threading.Event()
        #: Set when the scheduler stops: a retry that waits gives up.
        self.stopping = threading.Event()
        self._counts_lock = threading.Lock()
        self._skipped = 0
        self._running: dict[str, _Running] = {}
        self._claimed: dict[str, _ClaimedRun] = {}  # claimed in a batch, not started yet

    @property
    def skipped(self) -> int:
        with self._counts_lock:
            return self._skipped

    # -- set-up --------------------------------------------------------------------------------

    def specs(self, definitions: list[TaskDefinition], *, complete: bool) -> list[TaskSpec]:
        """Build the specs of *definitions* and bring their rows in step with the code."""
        now = self.clock()
        built = []
        for definition in definitions:
            jitter = self.conf.jitter if definition.jitter is None else definition.jitter
            # A firing woken up to *jitter* after its fire time is late by design, not missed.
            threshold = self.conf.misfire_threshold + jitter
            built.append((definition, definition.trigger(self.default_zone, threshold), jitter))
        states = task_rows.sync_tasks(
            [(d.name, t) for d, t, _ in built], now=now, using=self.using, complete=complete
        )
        return [
            TaskSpec(
                name=d.name,
                definition=d,
                trigger=t,
                _state=states[d.name],
                jitter=jitter,
                timeout=timeout_of(d, self.conf),
            )
            for d, t, jitter in built
        ]

    def _lock_config(self, definition: TaskDefinition) -> LockConfiguration:
        """Return the lock of a locked task; built when it is taken, rather than kept per
        task."""
        most = definition.lock_at_most_for or self.conf.lock_at_most_for
        least = definition.lock_at_least_for
        if least is None:
            least = min(self.conf.lock_at_least_for, most)
        return LockConfiguration(definition.name, most, least)

    def first_fire_time(self, entry: Entry, *, now: datetime) -> datetime | None:
        spec: TaskSpec = entry.payload
        return self._wake(spec, spec.trigger.next_fire_time(now=now, state=spec.state))

    def _next(self, spec: TaskSpec) -> datetime | None:
        """Return when *spec* fires next, from its state as last known: the one place."""
        return self._wake(spec, spec.trigger.next_fire_time(now=self.clock(), state=spec.state))

    @staticmethod
    def _wake(spec: TaskSpec, fire_time: datetime | None) -> datetime | None:
        """Return when to dispatch *fire_time*: later by the task's jitter offset, if any."""
        if fire_time is None or not spec.jitter:
            return fire_time
        return fire_time + jitter_offset(spec.name, fire_time, spec.jitter)

    # -- one firing ----------------------------------------------------------------------------

    def run(self, entry: Entry, firing: Firing) -> datetime | None:
        """Run one firing of *entry* and return when it fires next; never raise."""
        spec: TaskSpec = entry.payload
        if spec.definition.engine is not None and spec.definition.lock:
            # Only the enqueue runs here, never task code: the thread keeps its connection, as
            # the claim threads do, rather than connect once per firing.
            with self._enqueue_connection.use():
                try:
                    return self._run_locked(spec, firing)
                except Exception as exc:
                    return self._back_off(spec, firing, exc)
        close_old_connections()
        try:
            if not spec.definition.lock:
                return self._run_unlocked(spec, firing)
            return self._run_locked(spec, firing)
        except Exception as exc:
            return self._back_off(spec, firing, exc)
        finally:
            close_old_connections()
            # What a task activated on this thread must not leak into the next task on it.
            translation.deactivate()
            timezone.deactivate()

    def _run_unlocked(self, spec: TaskSpec, firing: Firing) -> datetime | None:
        """Run on this instance whatever the others do; the schedule is kept in memory."""
        row = task_rows.read_row(spec.name, using=self.using)
        self._database_answered(spec)
        now = self.clock()
        if isinstance(firing, RunRequest):
            decision: Run | Skip = Run(None, request=firing)
            if row is not None:
                decision = decide(spec.trigger, spec.described, row, now=now, firing=firing)
            if isinstance(decision, Skip):
                self._count_skip(spec, None, decision.reason)
                return self._next(spec)
        else:
            due = spec.trigger.next_fire_time(now=now, state=spec.state)
            if due is None or due > now:  # woken early, after a back-off
                return self._wake(spec, due)
            if row is not None and row.paused:
                return self._skipped_firing(spec, due, "paused", assume_ran=True)
            decision = Run(due)
        if decision.fire_time is not None and decision.request is None:
            spec.state = replace(spec.state, last_fire_time=decision.fire_time)
        self._execute(spec, decision, row, held=None)
        return self._next(spec)

    def _run_locked(self, spec: TaskSpec, firing: Firing) -> datetime | None:
        if isinstance(firing, datetime) and spec.recheck is not None:
            if self._claimed_since(spec):
                return self._next(spec)
        if isinstance(firing, datetime) and spec.warned_trigger == spec.described:
            if self._still_replaced(spec):
                return self._skipped_firing(spec, firing, TRIGGER_CHANGED, assume_ran=True)
        lock = self.provider.lock(self._lock_config(spec.definition))
        metrics.lock_attempted(spec.name, lock is not None)
        if lock is None:
            return self._locked_elsewhere(spec, firing)
        spec.recheck = spec.locked_since = spec.locked_holder = None
        held = self.keepalive.hold(lock, spec.name) if self.keepalive is not None else None
        if held is None:
            held = KeptAliveLock(lock, spec.name, None)
        ran, run_id = False, None
        fire_time: datetime | None = None
        try:
            row = task_rows.read_row(spec.name, using=self.using)
            self._database_answered(spec)
            if row is None:  # deleted while the scheduler ran
                task_rows.ensure_row(spec.name, spec.trigger, now=self.clock(), using=self.using)
                row = task_rows.read_row(spec.name, using=self.using)
                assert row is not None
            spec.state = row.state
            decision = decide(spec.trigger, spec.described, row, now=self.clock(), firing=firing)
            if isinstance(decision, Skip):
                return self._decided_skip(spec, firing, decision)
            fire_time = decision.fire_time
            ran, run_id = self._execute(spec, decision, row, held)
            return self._next(spec)
        finally:
            if not held.release() and ran:
                self._lock_lost(spec, run_id, fire_time)
            if held.unreleased is not None:
                # The database failed the unlock: release it when it answers again, rather
                # than leave the lock held, by this very instance, until lock_at_most_for.
                self.outbox.add(f"the release of the lock of {spec.name}", held.unreleased.unlock)

    def _claimed_since(self, spec: TaskSpec) -> bool:
        """Return whether the fire time being looked at again was claimed meanwhile (one read,
        without the lock); if so, the schedule moves on from it."""
        assert spec.recheck is not None
        claimed = task_rows.read_last_fire_time(spec.name, using=self.using)
        self._database_answered(spec)
        if claimed is None or claimed < spec.recheck:
            return False
        self._settled_elsewhere(spec, claimed)
        return True

    def _settled_elsewhere(
        self, spec: TaskSpec, last: datetime, skipped: datetime | None = None
    ) -> None:
        """Note that another instance claimed the fire time *last* of *spec*, so that this
        one skips *skipped* (by default *last* itself): its schedule moves on from *last*,
        with nothing left to look at again."""
        spec.state = replace(spec.state, last_fire_time=last)
        spec.recheck = None
        self._count_skip(spec, last if skipped is None else skipped, "already run")

    def _still_replaced(self, spec: TaskSpec) -> bool:
        """Return whether the row still holds the newer deployment's trigger (one read,
        without the lock): an older deployment that skips each firing must not hold the lock,
        for ``lock_at_least_for``, when the newer one needs it."""
        row = task_rows.read_row(spec.name, using=self.using)
        self._database_answered(spec)
        if row is not None and row.trigger and row.trigger != spec.described:
            return True
        spec.warned_trigger = None  # this trigger is the row's again
        return False

    def _execute(
        self,
        spec: TaskSpec,
        decision: Run,
        row: task_rows.TaskRow | None,
        held: KeptAliveLock | None,
    ) -> tuple[bool, int | None]:
        """Take the run (claim or request), call the task and record its end; return whether
        it ran (not when another instance took the firing first) and the run's id (``None``
        with the history off)."""
        if spec.definition.engine is not None:
            return self._enqueue(spec, decision, row, held)
        fire_time = decision.fire_time
        started = self.clock()
        run_id = self._record_start(
            spec,
            fire_time,
            started,
            decision.request,
            _locked_at(held),
            missed=decision.missed,
        )
        try:
            taken, planned, seen = self._take(spec, decision, row, started, run_id)
        except DatabaseError:
            self._forget_start(run_id)
            raise
        if not taken:  # another instance was first (or a newer deployment synced the row)
            self._forget_start(run_id)
            self._count_skip(spec, fire_time, "already run")
            return False, None
        if decision.claim:
            spec.state = replace(spec.state, last_fire_time=fire_time)
        recovery_of = decision.request.recover_run_id if decision.request is not None else None
        ended = self._call_noted(spec, fire_time, run_id, held, started, recovery_of=recovery_of)
        run_id = ended.run_id
        self._record_end(
            spec, run_id, ended.status, ended.started, ended.finished, ended.error, planned, seen
        )
        self._signal_end(spec, fire_time, run_id, ended.duration, ended.exc)
        return True, run_id

    def _take(
        self,
        spec: TaskSpec,
        decision: Run,
        row: task_rows.TaskRow | None,
        started: datetime,
        run_id: int | None,
    ) -> tuple[bool, datetime | None, datetime | None]:
        """Take the run: claim its fire time, or take its request; return whether it was
        taken, the planned next fire time (of a claim) and the fire time the row now holds."""
        fire_time, request = decision.fire_time, decision.request
        planned: datetime | None = None
        seen = row.state.last_fire_time if row is not None else None
        if decision.claim:
            assert fire_time is not None
            planned = self._wake(
                spec,
                spec.trigger.next_fire_time(
                    now=started, state=replace(spec.state, last_fire_time=fire_time)
                ),
            )
            taken = task_rows.claim(
                spec.name,
                fire_time,
                using=self.using,
                trigger=spec.described,
                run_id=run_id,
                next_fire_time=planned,
            )
            seen = fire_time
        elif request is not None and request.recover_run_id is not None:
            taken = task_rows.take_recovery(spec.name, request.recover_run_id, using=self.using)
        elif request is not None and request.requested_at is not None:
            taken = task_rows.take_run_request(spec.name, request.requested_at, using=self.using)
        else:
            taken = True
        return taken, planned, seen

    def _enqueue(
        self,
        spec: TaskSpec,
        decision: Run,
        row: task_rows.TaskRow | None,
        held: KeptAliveLock | None,
    ) -> tuple[bool, int | None]:
        """Take the run and hand the task to its engine instead of calling it; return whether
        it was taken, and the run's id.

        With a django.tasks database backend on the scheduler's database, the run's record,
        the claim and the enqueue commit in one transaction: exactly once. Any other backend
        is enqueued right after the claim commits: a crash between the two loses that fire
        time (its run, left "running", is later marked lost). A failed enqueue is a failed run;
        the task fires again at its next fire time.
        """
        definition = spec.definition
        assert definition.engine is not None
        together = engines.commits_with(definition.func, definition.engine, self.using)
        fire_time = decision.fire_time
        started = self.clock()
        with transaction.atomic(using=self.using) if together else contextlib.nullcontext():
            run_id = self._record_start(
                spec,
                fire_time,
                started,
                decision.request,
                _locked_at(held),
                missed=decision.missed,
            )
            try:
                taken, planned, seen = self._take(spec, decision, row, started, run_id)
            except DatabaseError:
                if not together:  # else the transaction's rollback removes the record
                    self._forget_start(run_id)
                raise
            if not taken:
                if together:
                    transaction.set_rollback(True, using=self.using)
                else:
                    self._forget_start(run_id)
                self._count_skip(spec, fire_time, "already run")
                return False, None
            if together:
                # A database error of the enqueue is raised: the claim rolls back with it, and
                # the firing backs off and is tried again (never a claim without its enqueue).
                handed = self._hand_over(spec, fire_time, started, savepoint=True)
                if run_id is not None:
                    history.record_end(
                        using=self.using,
                        run_id=run_id,
                        status=handed.status,
                        started=started,
                        finished=handed.finished,
                        error=handed.error,
                        backend=handed.backend,
                        result_id=handed.result_id,
                    )
        # Committed: receivers never run inside the claim's transaction.
        if decision.claim:
            spec.state = replace(spec.state, last_fire_time=fire_time)
        _send(signals.run_started, spec.name, task=definition, scheduled_at=fire_time, run=run_id)
        if not together:
            handed = self._hand_over(spec, fire_time, started, savepoint=False)
        spec.state = replace(spec.state, last_finished=handed.finished)
        self._record_end(
            spec,
            run_id,
            handed.status,
            started,
            handed.finished,
            handed.error,
            planned,
            seen,
            backend=handed.backend,
            result_id=handed.result_id,
            run_recorded=together,
        )
        duration = handed.finished - started
        if handed.exc is not None:
            self._signal_end(spec, fire_time, run_id, duration, handed.exc)
        else:
            _send(
                signals.run_enqueued,
                spec.name,
                task=definition,
                scheduled_at=fire_time,
                run=run_id,
                duration=duration,
                backend=handed.backend,
                result_id=handed.result_id,
            )
        return True, run_id

    def _hand_over(
        self, spec: TaskSpec, fire_time: datetime | None, started: datetime, *, savepoint: bool
    ) -> _HandedOver:
        """Enqueue one call of the task on its engine; a failure is a failed run. Only a
        database error inside the caller's transaction (*savepoint*: the enqueue writes in it)
        is raised, so that the claim rolls back with it.

        A publish that fails is tried again, with a growing wait, until the firing's deadline:
        its next fire time (never past its message's expiry; without either, for
        ``PUBLISH_RETRY_FOR``). One that returns only after its message's expiry counts as
        failed: the worker will drop it.
        """
        definition = spec.definition
        assert definition.engine is not None
        backend = engines.backend_name(definition.func, definition.engine)
        expires = self._expires(spec, fire_time, started)
        # The firing's deadline: its next fire time, and never past its message's expiry.
        bounds = [self._retry_bound(spec, fire_time, started), expires]
        deadline = min([bound for bound in bounds if bound is not None], default=None)
        deadline = deadline or started + PUBLISH_RETRY_FOR
        # The time left until the deadline, spent in real time from here on.
        budget_ends = time.monotonic() + (deadline - started).total_seconds()
        attempt = 0
        while True:
            attempt += 1
            try:
                with (
                    transaction.atomic(using=self.using) if savepoint else contextlib.nullcontext()
                ):
                    enqueued = engines.enqueue(
                        definition.func,
                        definition.engine,
                        definition.args,
                        definition.kwargs,
                        expires=expires,
                        time_limit=spec.timeout,
                    )
                break
            except Exception as exc:  # the broker is down, the arguments do not serialize, ...
                if savepoint and isinstance(exc, DatabaseError):
                    raise  # the caller's transaction fails with it: nothing is claimed
                wait = retry_delay(attempt, PUBLISH_BACKOFF, PUBLISH_BACKOFF_MAX, random.random())
                # Not inside the claim's transaction: it would hold the task's row meanwhile.
                in_time = time.monotonic() + wait.total_seconds() < budget_ends
                if not savepoint and in_time and not self.stopping.is_set():
                    logger.warning(
                        "Could not enqueue %s (scheduled for %s) on %s: %s; trying again in %s",
                        spec.name,
                        _when(fire_time),
                        backend,
                        exc,
                        _ms(wait),
                    )
                    if not self.stopping.wait(wait.total_seconds()):
                        continue
                logger.exception(
                    "Could not enqueue %s (scheduled for %s) on %s in %d attempt(s), until %s; "
                    "it fires again at its next fire time",
                    spec.name,
                    _when(fire_time),
                    backend,
                    attempt,
                    deadline.isoformat(),
                )
                error = (
                    f"{type(exc).__module__}.{type(exc).__qualname__}",
                    f"{exc} (in {attempt} attempt(s), until {deadline.isoformat()})",
                    traceback.format_exc(),
                )
                return _HandedOver(RunStatus.FAILED, self.clock(), backend, "", error, exc)
        finished = self.clock()
        if expires is not None and finished > expires:
            late = EnqueuedTooLate(spec.name, enqueued.result_id, finished, expires)
            logger.error("%s", late)
            error = (f"{EnqueuedTooLate.__module__}.{EnqueuedTooLate.__qualname__}", str(late), "")
            return _HandedOver(
                RunStatus.FAILED, finished, enqueued.backend, enqueued.result_id, error, late
            )
        logger.info(
            "Enqueued %s (scheduled for %s) on %s as %s",
            spec.name,
            _when(fire_time),
            enqueued.backend,
            enqueued.result_id,
        )
        return _HandedOver(
            RunStatus.ENQUEUED, finished, enqueued.backend, enqueued.result_id, ("", "", "")
        )

    def _expires(
        self, spec: TaskSpec, fire_time: datetime | None, started: datetime
    ) -> datetime | None:
        """Return when a Celery message of this firing expires, counted from its fire time:
        ``expires=`` after it, else at the task's next fire time (a message still waiting then
        is dropped by the worker, which runs the next one instead). A message delayed by an
        outage but still within its period is run.

        A firing sent after its next fire time had already come (a catch-up of
        ``missed="run_all"``, a recovery) gets one period from its send instead, not an expiry
        in the past; a manual run, ``expires=`` from its send. Never for fixed-delay tasks and
        manual runs without ``expires=``.
        """
        expires = spec.definition.expires
        if spec.definition.engine != engines.CELERY or expires is False:
            return None
        if isinstance(expires, timedelta):
            return (fire_time or started) + expires
        if fire_time is None or spec.trigger.kind == "fixed_delay":
            return None
        following = spec.trigger.next_fire_time(
            now=fire_time, state=replace(spec.state, last_fire_time=fire_time)
        )
        if following is None:
            return None
        if following <= started:
            return started + (following - fire_time)
        return following

    def _call_noted(
        self,
        spec: TaskSpec,
        fire_time: datetime | None,
        run_id: int | None,
        held: KeptAliveLock | None,
        started: datetime,
        *,
        recovery_of: int | None = None,
    ) -> _Ended:
        """Call the task, noted as running here meanwhile (for a shutdown that times out, and
        for the timeout watch), and again for each retry its ``retries=`` allow; return how
        the last attempt ended. The ends of the attempts before it are recorded here."""
        definition = spec.definition
        attempt = 1
        bound = self._retry_bound(spec, fire_time, started) if definition.retries else None
        while True:
            ended = self._attempt(spec, fire_time, run_id, held, started)
            if ended.exc is None or attempt > definition.retries:
                break
            wait = retry_delay(
                attempt, definition.retry_backoff, definition.retry_backoff_max, random.random()
            )
            why_not = self._no_retry_because(spec, held, bound, ended.finished + wait)
            if why_not is not None:
                logger.warning(
                    "Not retrying %s (scheduled for %s) after attempt %d: %s",
                    spec.name,
                    _when(fire_time),
                    attempt,
                    why_not,
                )
                break
            logger.warning(
                "Attempt %d of %s (scheduled for %s) failed; trying again in %s (%d of %d retries)",
                attempt,
                spec.name,
                _when(fire_time),
                _ms(wait),
                attempt,
                definition.retries,
            )
            self._record_attempt(spec, run_id, started, ended)
            self._signal_end(spec, fire_time, run_id, ended.duration, ended.exc)
            if self.stopping.wait(wait.total_seconds()):
                ended = replace(ended, retry_stopped=True)
                break
            attempt += 1
            started = self.clock()
            run_id = self._record_start(
                spec,
                fire_time,
                started,
                RunRequest(recover_run_id=recovery_of) if recovery_of is not None else None,
                _locked_at(held),
                attempt=attempt,
            )
        if ended.duration > max(LOCKED_REPORT_AFTER, spec.longest_run):  # only such runs matter
            spec.longest_run = ended.duration
        spec.state = replace(spec.state, last_finished=ended.finished)
        return replace(ended, run_id=run_id, started=started)

    def _attempt(
        self,
        spec: TaskSpec,
        fire_time: datetime | None,
        run_id: int | None,
        held: KeptAliveLock | None,
        started: datetime,
    ) -> _Ended:
        """Call the task once, noted as running meanwhile; return how it ended."""
        deadline = None if spec.timeout is None else time.monotonic() + spec.timeout.total_seconds()
        with self._counts_lock:
            self._running[spec.name] = _Running(run_id, held, deadline, spec.timeout)
        try:
            status, error, duration, exc = self._call(spec, fire_time, run_id, deadline)
        finally:
            with self._counts_lock:
                self._running.pop(spec.name, None)
        return _Ended(status, error, duration, exc, self.clock(), run_id, started)

    def _retry_bound(
        self, spec: TaskSpec, fire_time: datetime | None, started: datetime
    ) -> datetime | None:
        """Return the fire time that the retries of this run must not reach: the next one of
        the schedule (``None``: none, as for a fixed delay, which counts from the run's end)."""
        if spec.trigger.kind == "fixed_delay":
            return None
        if fire_time is None:  # a manual run: the task's next fire time as things stand
            return spec.trigger.next_fire_time(now=started, state=spec.state)
        after = replace(spec.state, last_fire_time=fire_time)
        return spec.trigger.next_fire_time(now=fire_time, state=after)

    def _no_retry_because(
        self,
        spec: TaskSpec,
        held: KeptAliveLock | None,
        bound: datetime | None,
        retry_at: datetime,
    ) -> str | None:
        """Return why a failed attempt is not tried again at *retry_at*; ``None``: it is."""
        if self.stopping.is_set():
            return "the scheduler is stopping"
        if held is not None and held.lost:
            return "its lock was lost"
        if bound is not None and retry_at >= bound:
            return (
                f"a retry at {retry_at.isoformat()} would reach the next fire time "
                f"{bound.isoformat()}, which comes first"
            )
        return None

    def _record_attempt(
        self, spec: TaskSpec, run_id: int | None, started: datetime, ended: _Ended
    ) -> None:
        """Record the end of an attempt that is tried again (a database error keeps it in the
        outbox: the attempt happened)."""
        if run_id is None:
            return

        def write() -> None:
            history.record_end(
                using=self.using,
                run_id=run_id,
                status=ended.status,
                started=started,
                finished=ended.finished,
                error=ended.error,
            )

        try:
            write()
        except DatabaseError as exc:
            logger.error("Could not record attempt %s of %s yet (%s)", run_id, spec.name, exc)
            self.outbox.add(f"the end of run {run_id} of {spec.name}", write)

    def running(self) -> dict[str, float]:
        """Return the tasks that run on this process's worker threads now, with how many
        seconds each has run."""
        now = time.monotonic()
        with self._counts_lock:
            return {name: now - running.begun for name, running in self._running.items()}

    def watch_timeouts(self, monotonic: float) -> list[str]:
        """Report, once each, the runs of this process that have passed their timeout by
        *monotonic* (``time.monotonic()``); return their tasks' names. No I/O: the history
        row tells the rest of the world by its ``timeout_at``."""
        with self._counts_lock:
            late = [
                (name, running)
                for name, running in self._running.items()
                if running.deadline is not None
                and not running.reported
                and monotonic >= running.deadline
            ]
            for _, running in late:
                running.reported = True
        for name, running in late:
            logger.warning(
                "Run %s of %s has passed its timeout of %s: it is reported as timed out, and "
                "cancel_requested() is true inside it. The scheduler cannot stop a thread: the "
                "run keeps its lock until it returns.",
                running.run_id,
                name,
                format_duration(running.timeout) if running.timeout else "?",
            )
        return [name for name, _ in late]

    def _signal_end(
        self,
        spec: TaskSpec,
        fire_time: datetime | None,
        run_id: int | None,
        duration: timedelta,
        exc: BaseException | None,
    ) -> None:
        common = {"task": spec.definition, "scheduled_at": fire_time, "run": run_id}
        if exc is None:
            _send(signals.run_succeeded, spec.name, duration=duration, **common)
        else:
            _send(signals.run_failed, spec.name, exception=exc, duration=duration, **common)

    def _call(
        self,
        spec: TaskSpec,
        fire_time: datetime | None,
        run_id: int | None,
        deadline: float | None = None,
    ) -> tuple[RunStatus, tuple[str, str, str], timedelta, BaseException | None]:
        """Call the task; return its status, error, duration and exception. A run longer than
        the task's timeout ends *timed out*, with a ``RunTimedOut`` as its exception."""
        definition = spec.definition
        _send(
            signals.run_started,
            spec.name,
            task=definition,
            scheduled_at=fire_time,
            run=run_id,
        )
        logger.info("Running %s (scheduled for %s)", spec.name, _when(fire_time))
        begun = time.perf_counter()
        failure: BaseException | None = None
        failed_traceback = ""
        try:
            # In a copy of this thread's context: what the task sets in context variables
            # (Django's active translation and time zone among them) ends with its run.
            contextvars.copy_context().run(_invoke, definition, fire_time, deadline)
        except (Exception, SystemExit) as exc:  # sys.exit() in a task fails that run only
            failure = exc
            failed_traceback = traceback.format_exc()
        duration = timedelta(seconds=time.perf_counter() - begun)
        if spec.timeout is not None and duration > spec.timeout:
            timed_out = RunTimedOut(spec.name, duration, spec.timeout, failure)
            logger.error("%s", timed_out)
            if failure is not None:
                close_old_connections()
            error = (
                f"{RunTimedOut.__module__}.{RunTimedOut.__qualname__}",
                str(timed_out),
                failed_traceback if failure is not None else "",
            )
            return RunStatus.TIMED_OUT, error, duration, timed_out
        if failure is not None:
            logger.error(
                "Task %s failed after %s",
                spec.name,
                _ms(duration),
                exc_info=(type(failure), failure, failure.__traceback__),
            )
            # A failed task may leave its connection unusable; the run is still recorded.
            close_old_connections()
            error = (
                f"{type(failure).__module__}.{type(failure).__qualname__}",
                str(failure),
                failed_traceback,
            )
            return RunStatus.FAILED, error, duration, failure
        logger.info("Task %s succeeded in %s", spec.name, _ms(duration))
        return RunStatus.SUCCEEDED, ("", "", ""), duration, None

    # -- firings claimed in batches ------------------------------------------------------------

    def batchable(self, entry: Entry, firing: Firing) -> bool:
        """Return whether *firing* can be claimed in a batch: a scheduled firing of a locked
        task, when a writer records the ends and the lock provider takes locks in batches."""
        spec: TaskSpec = entry.payload
        return (
            self.writer is not None
            and spec.definition.engine is None  # enqueued one at a time: see _enqueue()
            and spec.definition.lock
            and isinstance(firing, datetime)
            and hasattr(self.provider, "lock_many")
        )

    def run_batch(self, items: list[tuple[Entry, Firing]]) -> list[Outcome]:
        """Claim the firings *items*, due together, in a few statements whatever their
        number, and return what becomes of each: a ``Call`` for those this instance runs,
        the next fire time of the others, ``SINGLE`` for those ``run()`` must handle.

        The path of ``run()``, for many firings at once: read the rows (and the lock rows and
        the database's clock, in the same statement), decide each, take the locks of those to
        run, record their starts, claim their fire times, then hand them to the pool; their
        ends go to the writer, which releases the locks. Never raises.
        """
        specs: list[TaskSpec] = [entry.payload for entry, _ in items]
        outcomes: list[Outcome] = [SINGLE] * len(items)
        with self._claims_connection.use():
            try:
                self._claim_batch(specs, [firing for _, firing in items], outcomes)
            except Exception as exc:
                # A failure before the claims: nothing ran, nothing is held. Back off those
                # not settled yet.
                for index, (spec, (_, firing)) in enumerate(zip(specs, items, strict=True)):
                    if outcomes[index] is SINGLE:
                        outcomes[index] = self._back_off(spec, firing, exc)
        return outcomes

    def _claim_batch(
        self, specs: list[TaskSpec], firings: list[Firing], outcomes: list[Outcome]
    ) -> None:
        found = task_rows.read_rows([spec.name for spec in specs], using=self.using)
        now = self.clock()
        # A burst claimed ahead of its instant is decided, claimed and recorded as at that
        # instant: what every instance decides then (see ``scheduler.claim_ahead``).
        instant = max([now, *(firing for firing in firings if isinstance(firing, datetime))])
        remembered: dict[int, _Remembered] = {}
        for spec in specs:
            if id(spec.trigger) not in remembered:
                remembered[id(spec.trigger)] = _Remembered(spec.trigger)
        to_run: dict[int, Run] = {}
        for index, (spec, firing) in enumerate(zip(specs, firings, strict=True)):
            row = found.rows.get(spec.name)
            if row is None:
                continue  # deleted while the scheduler ran: run() creates it again
            self._database_answered(spec)
            spec.state = row.state
            last = row.state.last_fire_time
            if spec.recheck is not None and last is not None and last >= spec.recheck:
                self._settled_elsewhere(spec, last)  # claimed since it was found locked
                outcomes[index] = self._next(spec)
                continue
            trigger = remembered[id(spec.trigger)]
            at = max(now, firing) if isinstance(firing, datetime) else now
            decision = decide(trigger, spec.described, row, now=at, firing=firing)  # type: ignore[arg-type]
            if isinstance(decision, Skip):
                if decision.claim is None:  # a paused task's claim needs the lock: run()
                    outcomes[index] = self._decided_skip(spec, firing, decision)
                continue
            to_run[index] = decision
        if not to_run:
            return
        configs = [self._lock_config(specs[index].definition) for index in to_run]
        absent = {config.name for config in configs if config.name not in found.locks}
        for attempt in (1, 2):
            try:
                # One commit for the locks, the runs' records and the claims: all or none.
                with transaction.atomic(using=self.using):
                    locks = self.provider.lock_many(  # type: ignore[attr-defined]
                        configs, now=found.now, absent=absent, joined=True
                    )
                    metrics.locks_attempted([config.name for config in configs], locks)
                    won = [(i, locks[specs[i].name]) for i in to_run if specs[i].name in locks]
                    run_ids: list[int | None] = []
                    claimed: dict[str, datetime | None] = {}
                    if won:
                        started = max(self.clock(), instant)
                        run_ids, claimed = self._record_and_claim(
                            specs, to_run, won, started, remembered
                        )
                break
            except (DatabaseError, LockError) as exc:
                # Another instance's transaction crossed this one (a deadlock): the database
                # rolled this one back, so nothing is taken. Once more at once, rather than back
                # off past the fire time.
                if not is_conflict(exc):
                    raise
                if attempt == 2:
                    # Still crossed, or a lock row that another transaction keeps locked (an
                    # admin edit, a stuck session): one firing at a time, where such a row
                    # counts as held elsewhere for its own task only.
                    logger.warning(
                        "Claiming %d firings together failed twice: %s", len(configs), exc
                    )
                    return
                logger.info(
                    "Claiming %d firings met a concurrent claim; trying again", len(configs)
                )
        try:
            taken = self._claimed_meanwhile(specs, to_run, locks)
            for index in to_run:
                spec = specs[index]
                if spec.name in taken:
                    # Its lock and its fire time went to another instance after the row was
                    # read.
                    self._settled_elsewhere(spec, taken[spec.name], to_run[index].fire_time)
                    outcomes[index] = self._next(spec)
                elif spec.name not in locks:
                    holder = found.locks.get(spec.name)
                    outcomes[index] = self._locked_elsewhere(spec, firings[index], holder)
                else:
                    spec.recheck = spec.locked_since = spec.locked_holder = None
            if won:
                ahead = {
                    i: firing
                    for i in to_run
                    if isinstance(firing := firings[i], datetime) and firing > now
                }
                self._start_batch(specs, to_run, won, run_ids, claimed, outcomes, ahead)
        except Exception:
            # After the commit: what was claimed and will not run now must not stay locked.
            pending = [
                (lock, run_id)
                for (index, lock), run_id in zip(won, run_ids or [None] * len(won), strict=True)
                if not isinstance(outcomes[index], Call)
            ]
            self._release_unrun([lock for lock, _ in pending], [r for _, r in pending if r])
            raise

    def _claimed_meanwhile(
        self, specs: list[TaskSpec], decisions: dict[int, Run], locks: dict[str, Any]
    ) -> dict[str, datetime]:
        """Return the last fire times of the firings of *decisions* whose lock was not taken
        because another instance claimed them since their rows were read (in one statement).

        Instances claiming the same burst meet this way; without a look at the rows, each such
        firing would be looked at again a second later (see ``_locked_elsewhere``).
        """
        missed = {specs[i].name: decisions[i].fire_time for i in decisions}
        missed = {name: fire for name, fire in missed.items() if name not in locks}
        if not missed:
            return {}
        try:
            claims = task_rows.read_claims(list(missed), using=self.using)
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

    def _record_and_claim(
        self,
        specs: list[TaskSpec],
        decisions: dict[int, Run],
        won: list[tuple[int, Any]],
        started: datetime,
        remembered: dict[int, _Remembered],
    ) -> tuple[list[int | None], dict[str, datetime | None]]:
        """Record the starts of the firings *won* (their locks taken) and claim their fire
        times; return the run ids and the planned next fire time of each claimed one."""
        run_ids: list[int | None] = [None] * len(won)
        if self.conf.history:
            starts = [
                (
                    specs[i].name,
                    decisions[i].fire_time,
                    lock.locked_at,
                    _timeout_at(started, specs[i].timeout),
                    decisions[i].missed,
                )
                for i, lock in won
            ]
            run_ids = list(
                history.record_starts(
                    using=self.using,
                    instance=self.conf.instance_name,
                    started=started,
                    runs=starts,
                )
            )
        return run_ids, self._claim_many(specs, decisions, won, run_ids, started, remembered)

    def _start_batch(
        self,
        specs: list[TaskSpec],
        decisions: dict[int, Run],
        won: list[tuple[int, Any]],
        run_ids: list[int | None],
        claimed: dict[str, datetime | None],
        outcomes: list[Outcome],
        ahead: dict[int, datetime],
    ) -> None:
        """Make each claimed firing of *won* a ``Call``, that starts at its time in *ahead* if
        it was claimed ahead of it; release the locks of the others."""
        unrun_locks, unrun_ids = [], []
        to_start: list[tuple[int, Any, int | None]] = []
        for (index, lock), run_id in zip(won, run_ids, strict=True):
            spec = specs[index]
            if spec.name not in claimed:
                unrun_locks.append(lock)
                if run_id is not None:
                    unrun_ids.append(run_id)
                self._count_skip(spec, decisions[index].fire_time, "already run")
                outcomes[index] = self._next(spec)
                continue
            to_start.append((index, lock, run_id))
        # One keep-alive record for the locks of the batch until each run starts.
        waiting = WaitingLocks([lock for _, lock, _ in to_start], self.keepalive)
        for slot, (index, _, run_id) in enumerate(to_start):
            spec = specs[index]
            fire_time = decisions[index].fire_time
            spec.state = replace(spec.state, last_fire_time=fire_time)
            claimed_run = _ClaimedRun(
                self, spec, fire_time, run_id, waiting, slot, claimed[spec.name], ahead.get(index)
            )
            with self._counts_lock:
                self._claimed[spec.name] = claimed_run
            outcomes[index] = claimed_run
        if unrun_locks:
            self._release_unrun(unrun_locks, unrun_ids)

    def _claim_many(
        self,
        specs: list[TaskSpec],
        decisions: dict[int, Run],
        won: list[tuple[int, Any]],
        run_ids: list[int | None],
        started: datetime,
        remembered: dict[int, _Remembered],
    ) -> dict[str, datetime | None]:
        """Claim the fire times of *won*, one statement per distinct fire time; return the
        planned next fire time of each claimed one, by name."""
        groups: dict[datetime, list[tuple[str, str, int | None, datetime | None]]] = {}
        for (index, _), run_id in zip(won, run_ids, strict=True):
            spec = specs[index]
            fire_time = decisions[index].fire_time
            assert fire_time is not None
            after = replace(spec.state, last_fire_time=fire_time)
            trigger = remembered[id(spec.trigger)]
            planned = self._wake(spec, trigger.next_fire_time(now=started, state=after))
            groups.setdefault(fire_time, []).append((spec.name, spec.described, run_id, planned))
        claimed: dict[str, datetime | None] = {}
        for fire_time, claims in groups.items():
            if not self.conf.history:
                # No run id to tell this instance's claims from another's afterwards: claim
                # only the rows found claimable, locked until the commit.
                open_rows = task_rows.claimable(fire_time, claims, using=self.using)
                claims = [claim for claim in claims if claim[0] in open_rows]
            count = task_rows.claim_many(fire_time, claims, using=self.using)
            if count == len(claims):
                claimed.update((name, planned) for name, _, _, planned in claims)
                continue
            # Some were claimed first by another instance, or their trigger was replaced by a
            # newer deployment. The run id written by the claim tells which are this one's.
            # (With the history off the claimable rows were locked first: this cannot happen;
            # if it did, a row at this fire time would not be counted as this instance's.)
            rows = task_rows.read_claims([name for name, _, _, _ in claims], using=self.using)
            for name, _, run_id, planned in claims:
                if run_id is not None and rows.get(name) == (fire_time, run_id):
                    claimed[name] = planned
                elif run_id is None and count and rows.get(name, (None,))[0] == fire_time:
                    logger.warning(
                        "Not running %s (scheduled for %s): its claim cannot be told from "
                        "another instance's with the history off",
                        name,
                        fire_time,
                    )
        return claimed

    def _release_unrun(self, locks: list[Any], run_ids: list[int]) -> None:
        """Release the locks of firings that will not run, and remove their run records."""
        try:
            if run_ids:
                history.forget_starts(using=self.using, run_ids=run_ids)
        except DatabaseError as exc:
            logger.warning("Could not remove the records of runs that did not run yet: %s", exc)
            forget = lambda: history.forget_starts(using=self.using, run_ids=run_ids)  # noqa: E731
            self.outbox.add(f"the removal of {len(run_ids)} run(s) that did not run", forget)
        assert self.writer is not None
        self.writer.release(locks)

    def _run_claimed(self, run: _ClaimedRun, done: Callable[[datetime | None], None]) -> None:
        """Run a firing claimed in a batch (on a worker thread) and hand its end to the
        writer, which calls ``done`` with the next fire time once it is recorded."""
        assert self.writer is not None
        spec = run.spec
        with self._counts_lock:
            self._claimed.pop(spec.name, None)
            if not self._claimed:
                self._claimed.clear()  # frees the table a burst grew (a pop never shrinks it)
        run.take_lock()
        started = self.clock()
        try:
            self._finish_claimed(run, done, started)
        except BaseException as exc:
            # Whatever escaped (a CancelledError, a trigger that raised): the run is over, its
            # lock must not be kept alive, and its task must fire again.
            logger.exception("Finishing the run of %s failed", spec.name)
            lock = run.take_lock().detach()
            end = None
            if run.run_id is not None:
                error = (f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), "")
                end = history.Ended(run.run_id, RunStatus.FAILED, started, self.clock(), error)
            retry = self.clock() + timedelta(seconds=1)
            self.writer.add(Finished(spec.name, end, None, lock, lambda lost: done(retry)))
            if isinstance(exc, KeyboardInterrupt):
                raise

    def _finish_claimed(
        self, run: _ClaimedRun, done: Callable[[datetime | None], None], started: datetime
    ) -> None:
        assert self.writer is not None
        spec, fire_time, run_id, held = run.spec, run.fire_time, run.run_id, run.take_lock()
        planned = run.planned
        close_old_connections()
        try:
            ended = self._call_noted(spec, fire_time, run_id, held, started)
        finally:
            close_old_connections()
        status, error, duration, exc, finished = (
            ended.status,
            ended.error,
            ended.duration,
            ended.exc,
            ended.finished,
        )
        run_id, started = ended.run_id, ended.started
        run.run_id = run_id
        if planned is not None and finished < planned and spec.trigger.kind != "fixed_delay":
            next_time: datetime | None = planned  # what _next() says while it is ahead
        else:
            next_time = self._next(spec)
        row_write = None
        if spec.trigger.kind == "fixed_delay" or next_time != planned:

            def row_write() -> None:
                if not task_rows.record_finish(
                    spec.name,
                    using=self.using,
                    seen_fire_time=fire_time,
                    finished_at=finished,
                    next_fire_time=next_time,
                ) and not self._trigger_replaced(spec):
                    self._lock_lost(spec, run_id, fire_time)

        # What the writer's call back needs: kept on the run, not in a closure per run.
        run.done, run.next_time, run.duration, run.exc = done, next_time, duration, exc
        end = None
        if run_id is not None:
            end = history.Ended(run_id, status, started, finished, error)
        self.writer.add(Finished(spec.name, end, row_write, held.detach(), run))

    def _claimed_written(self, run: _ClaimedRun, lost: bool) -> None:
        """The end of the claimed *run* is recorded: signal it, and tell the scheduler."""
        done, exc = run.done, run.exc
        run.done = run.exc = None  # nor the exception's traceback, once done
        assert done is not None
        try:
            if lost or run.take_lock().lost:
                self._lock_lost(run.spec, run.run_id, run.fire_time)
            self._signal_end(run.spec, run.fire_time, run.run_id, run.duration, exc)
        finally:
            done(run.next_time)

    def drain(self, timeout: float | None) -> bool:
        """Wait until the ends of the runs claimed in batches are recorded."""
        return self.writer.drain(timeout) if self.writer is not None else True

    # -- recording -----------------------------------------------------------------------------

    def _record_start(
        self,
        spec: TaskSpec,
        fire_time: datetime | None,
        started: datetime,
        request: RunRequest | None,
        locked_at: datetime | None,
        *,
        attempt: int = 1,
        missed: int = 0,
    ) -> int | None:
        if not self.conf.history:
            return None
        return history.record_start(
            using=self.using,
            task_name=spec.name,
            fire_time=fire_time,
            started=started,
            instance=self.conf.instance_name,
            recovery_of=request.recover_run_id if request is not None else None,
            locked_at=locked_at,
            attempt=attempt,
            timeout_at=_timeout_at(started, spec.timeout),
            missed=missed,
        )

    def _forget_start(self, run_id: int | None) -> None:
        if run_id is None:
            return
        try:
            history.forget_start(using=self.using, run_id=run_id)
        except DatabaseError as exc:
            # Left "running", it would later pass for a lost run, and recover=True would run
            # its fire time again: remove it when the database answers.
            logger.warning("Could not remove the record of run %s yet: %s", run_id, exc)
            forget = lambda: history.forget_start(using=self.using, run_id=run_id)  # noqa: E731
            self.outbox.add(f"the removal of run {run_id}, which did not run", forget)

    def _record_end(
        self,
        spec: TaskSpec,
        run_id: int | None,
        status: RunStatus,
        started: datetime,
        finished: datetime,
        error: tuple[str, str, str],
        planned: datetime | None,
        seen: datetime | None,
        *,
        backend: str = "",
        result_id: str = "",
        run_recorded: bool = False,
    ) -> None:
        """Record the end of a run: its history row (unless *run_recorded*), and the task row
        when the claim did not say it all. A database error keeps both in the outbox: the run
        happened."""
        next_time = self._next(spec)
        # A claim already stored the run and the planned next fire time; only a fixed-delay
        # task (whose next start depends on this finish), a run that overran its next fire
        # time, or a run without a claim (manual, unlocked) needs another write.
        claimed = planned is not None
        write_row = spec.trigger.kind == "fixed_delay" or not claimed or next_time != planned
        locked = spec.definition.lock

        def write() -> None:
            if run_id is not None and not run_recorded:
                history.record_end(
                    using=self.using,
                    run_id=run_id,
                    status=status,
                    started=started,
                    finished=finished,
                    error=error,
                    backend=backend,
                    result_id=result_id,
                )
            if write_row and not task_rows.record_finish(
                spec.name,
                using=self.using,
                seen_fire_time=seen,
                finished_at=finished if locked else None,
                next_fire_time=next_time,
                run_id=None if claimed else run_id,
            ):
                if locked and claimed and not self._trigger_replaced(spec):
                    # A newer claim: this run lost its lock to another instance meanwhile.
                    self._lock_lost(spec, run_id, seen)

        try:
            write()
        except DatabaseError as exc:
            logger.error(
                "Task %s ran (%s) but its end could not be recorded: the database is "
                "unavailable (%s). Recording it when the database is back.",
                spec.name,
                status,
                exc,
            )
            self.outbox.add(f"the end of run {run_id} of {spec.name}", write)

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

    def _lock_lost(self, spec: TaskSpec, run_id: int | None, fire_time: datetime | None) -> None:
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
                flag = lambda: history.flag_lock_lost(using=self.using, run_id=run_id)  # noqa: E731
                self.outbox.add(f"the lock_lost flag of run {run_id}", flag)
        logger.warning(
            "Run %s of %s (scheduled for %s) lost its lock while it ran: it expired, or another "
            "instance took it over; %s. Raise lock_at_most_for, or look for a frozen process.",
            run_id,
            spec.name,
            _when(fire_time),
            f"run {other} may have overlapped it"
            if other
            else "another run may have overlapped it",
        )
        _send(
            signals.lock_lost,
            spec.name,
            task=spec.definition,
            scheduled_at=fire_time,
            run=run_id,
            other_run=other,
        )

    # -- skips, rejections and outages ---------------------------------------------------------

    def _decided_skip(self, spec: TaskSpec, firing: Firing, decision: Skip) -> datetime | None:
        if decision.reason == TRIGGER_CHANGED and spec.warned_trigger != spec.described:
            spec.warned_trigger = spec.described
            logger.warning(
                "Not running %s: another deployment declared a different trigger for it since "
                "this process started; the newest deployment's trigger applies. Restart this "
                "process to apply its own.",
                spec.name,
            )
        if decision.claim is not None:  # paused: the fire time is served without a run
            task_rows.claim(
                spec.name,
                decision.claim,
                using=self.using,
                trigger=spec.described,
                run_id=None,
                next_fire_time=None,
            )
            spec.state = replace(spec.state, last_fire_time=decision.claim)
            self._count_skip(spec, decision.claim, decision.reason)
            return self._next(spec)
        if decision.reason == TRIGGER_CHANGED:
            return self._skipped_firing(spec, firing, decision.reason, assume_ran=True)
        self._count_skip(spec, firing if isinstance(firing, datetime) else None, decision.reason)
        if isinstance(firing, RunRequest):
            return self._next(spec)
        return self._wake(spec, decision.next_time)

    def _skipped_firing(
        self, spec: TaskSpec, firing: Firing, reason: str, *, assume_ran: bool
    ) -> datetime | None:
        """Count a skip and return the next fire time, assuming the firing ran elsewhere."""
        fire_time = firing if isinstance(firing, datetime) else None
        self._count_skip(spec, fire_time, reason)
        if assume_ran and fire_time is not None:
            spec.state = replace(spec.state, last_fire_time=fire_time, last_finished=self.clock())
        return self._next(spec)

    def _locked_elsewhere(
        self, spec: TaskSpec, firing: Firing, holder: task_rows.Holder | bool | None = False
    ) -> datetime | None:
        """The lock is held by another instance (or a process that died)."""
        now = self.clock()
        self._database_answered(spec)
        self._watch_holder(spec, now, holder)
        if isinstance(firing, RunRequest):
            # The request stays in the row until a run takes it; it is asked again.
            self._count_skip(spec, None, "locked")
            return self._next(spec)
        fire_time = spec.recheck or self._fire_time_of(spec, firing, now)
        if now - fire_time <= self.conf.misfire_threshold + spec.jitter:
            # Nobody may have claimed it yet: its holder can die first. Look again soon.
            spec.recheck = fire_time
            self._count_skip(spec, fire_time, "locked")
            upcoming = self._wake(
                spec,
                spec.trigger.next_fire_time(
                    now=now, state=replace(spec.state, last_fire_time=fire_time)
                ),
            )
            retry = now + LOCKED_RECHECK
            # Never sooner than that: a next fire time already due would make a busy loop.
            return upcoming if upcoming is not None and now < upcoming < retry else retry
        spec.recheck = None
        return self._skipped_firing(spec, fire_time, "locked", assume_ran=True)

    def _fire_time_of(self, spec: TaskSpec, woken: datetime, now: datetime) -> datetime:
        """Return the fire time a firing woken at *woken* serves: earlier by the jitter
        offset, for a task with jitter (a claim elsewhere is compared with the fire time)."""
        if not spec.jitter:
            return woken
        due = spec.trigger.next_fire_time(now=now, state=spec.state)
        return due if due is not None and due <= woken else woken

    def _watch_holder(
        self, spec: TaskSpec, now: datetime, holder: task_rows.Holder | bool | None = False
    ) -> None:
        """Warn when the lock stays with the same holder for longer than the task ever ran.

        *holder* is the lock's row as just read, if the caller read it (``False``: it did not).
        """
        if spec.locked_since is None:
            spec.locked_since = now
            return
        if now - spec.locked_since <= max(LOCKED_REPORT_AFTER, spec.longest_run):
            return
        spec.locked_since = now
        if holder is False or holder is True:
            holder = task_rows.read_lock_holder(spec.name, using=self.using)
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

    def _back_off(self, spec: TaskSpec, firing: Firing, exc: Exception) -> datetime:
        """Do not run; try again after a delay that doubles with each failure in a row."""
        spec.database_failures += 1
        backoff = min(2 ** (spec.database_failures - 1), _MAX_BACKOFF)
        fire_time = firing if isinstance(firing, datetime) else None
        if isinstance(exc, DatabaseError | LockError):
            self.outage.set()
            logger.error(
                "Not running %s (scheduled for %s): the database is unavailable (%s); "
                "trying again in %ss",
                spec.name,
                _when(fire_time),
                exc,
                backoff,
            )
            reason = "database unavailable"
        else:
            logger.exception(
                "Not running %s (scheduled for %s): the firing failed outside the task; trying "
                "again in %ss",
                spec.name,
                _when(fire_time),
                backoff,
            )
            reason = "error"
        self._signal_skip(spec, fire_time, reason)
        return self.clock() + timedelta(seconds=backoff)

    def _database_answered(self, spec: TaskSpec) -> None:
        spec.database_failures = 0

    def _count_skip(self, spec: TaskSpec, fire_time: datetime | None, reason: str) -> None:
        with self._counts_lock:
            self._skipped += 1
        logger.debug("Skipped %s at %s: %s", spec.name, _when(fire_time), reason)
        self._signal_skip(spec, fire_time, reason)

    def _signal_skip(self, spec: TaskSpec, fire_time: datetime | None, reason: str) -> None:
        _send(
            signals.run_skipped,
            spec.name,
            task=spec.definition,
            scheduled_at=fire_time,
            run=None,
            reason=reason,
        )

    def rejected(self, entry: Entry, firing: Firing, stats: PoolStats) -> None:
        """Note a firing the pool rejected. On the dispatcher thread: the history row is
        written later, by the service's maintenance thread."""
        spec: TaskSpec = entry.payload
        fire_time = firing if isinstance(firing, datetime) else None
        logger.warning(
            "The pool rejected %s (scheduled for %s): %s", spec.name, _when(fire_time), stats
        )
        if self.conf.history:
            record = {
                "using": self.using,
                "task_name": spec.name,
                "fire_time": fire_time,
                "now": self.clock(),
                "instance": self.conf.instance_name,
                "reason": f"rejected by the pool: {stats}",
            }
            self.outbox.add(
                f"the rejection of {spec.name}", lambda: history.record_rejection(**record)
            )
        self._signal_skip(spec, fire_time, "rejected")

    def next_after_rejection(self, entry: Entry, firing: Firing) -> datetime | None:
        spec: TaskSpec = entry.payload
        if not isinstance(firing, datetime):
            return entry.next_fire_time
        spec.state = replace(spec.state, last_fire_time=firing, last_finished=self.clock())
        return self._next(spec)

    def interrupted(self, names: list[str]) -> None:
        """Mark the runs of *names*, still running at shutdown, as interrupted, and release
        their locks: this process is about to exit, and another instance may take over."""
        with self._counts_lock:
            running: list[_Running | _ClaimedRun]
            running = [self._running[name] for name in names if name in self._running]
            # Claimed in a batch, but the pool shut down before they started: their fire times
            # are spent (at most once), their locks are released here.
            claimed = [self._claimed.pop(name) for name in names if name in self._claimed]
        for run in claimed:
            run.take_lock()
        for item in [*running, *claimed]:
            if item.held is not None:
                item.held.release()
        run_ids = [item.run_id for item in running if item.run_id is not None]
        history.mark_interrupted(using=self.using, run_ids=run_ids, now=self.clock())


def _invoke(definition: TaskDefinition, fire_time: datetime | None, deadline: float | None) -> None:
    func, args, kwargs = definition.func, definition.args, definition.kwargs
    with firing_context(fire_time, deadline):
        result = func(*args, **kwargs)
        if inspect.iscoroutine(result):  # an async task: run it to its end on this thread
            asyncio.run(result)


def _timeout_at(started: datetime, timeout: timedelta | None) -> datetime | None:
    return None if timeout is None else started + timeout


def _locked_at(held: KeptAliveLock | None) -> datetime | None:
    return held.lock.locked_at if held is not None and held.lock is not None else None


@dataclass(frozen=True, slots=True)
class _HandedOver:
    """What became of one enqueue: the run's status, when it ended, the backend, the result
    id, and the error (type, message, traceback) and exception of a failed one."""

    status: RunStatus
    finished: datetime
    backend: str
    result_id: str
    error: tuple[str, str, str]
    exc: Exception | None = None


def _send(signal: Any, sender: str, **kwargs: Any) -> None:
    run_events.publish(signal, sender, **kwargs)


def _ms(duration: timedelta) -> str:
    return f"{duration.total_seconds() * 1000:.1f} ms"


def _when(fire_time: datetime | None) -> str:
    return "now (manual run)" if fire_time is None else fire_time.isoformat()
