"""Run one firing: take the lock, agree on the fire time, call the task, record the run, release.

The order of a firing of a locked task:

1. Take the task's lock. Held elsewhere: skip quietly. Database unreachable: do not run (fail
   closed), and try again with a back-off.
2. Under the lock, read the task's row and compute the fire time due now from the shared state
   (anchor, last fire time, last finish). Already run by another instance, or not due yet: skip.
3. Record the run, move the row's last fire time to it (the claim), call the function while a
   timer keeps the lock alive, record the outcome, release the lock.

A task with ``lock=False`` runs on every instance and keeps its schedule in memory.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import close_old_connections
from django.utils import timezone, translation

from . import history, signals, state
from .clock import utcnow
from .conf import SchedulingSettings
from .keepalive import KeptAliveLock
from .locking import LockConfiguration, LockError, LockProvider
from .models import RunStatus
from .pool import PoolStats
from .registry import TaskDefinition
from .scheduler import Entry, Timer
from .triggers import Trigger, TriggerState

__all__ = ["TaskSpec", "TaskRunner", "current_fire_time"]

logger = logging.getLogger(__name__)

_MAX_BACKOFF = 60.0
_context = threading.local()


def current_fire_time() -> datetime | None:
    """Return the fire time the running task serves (``None`` in a manual run or outside)."""
    return getattr(_context, "fire_time", None)


@dataclass
class TaskSpec:
    """A task as the runner sees it: definition, trigger, lock, and its state as last known."""

    definition: TaskDefinition
    trigger: Trigger
    lock_config: LockConfiguration | None
    state: TriggerState
    failures: int = 0

    @property
    def name(self) -> str:
        return self.definition.name


class TaskRunner:
    """Run firings for the scheduler against the database and a lock provider."""

    def __init__(
        self,
        *,
        conf: SchedulingSettings,
        provider: LockProvider,
        default_zone: Any,
        clock: Any = utcnow,
    ) -> None:
        self.conf = conf
        self.provider = provider
        self.default_zone = default_zone
        self.clock = clock
        self.using = conf.database
        self.timer: Timer | None = None
        self.skipped = 0
        self._running_runs: dict[str, int] = {}
        self._runs_lock = threading.Lock()

    # -- set-up --------------------------------------------------------------------------------

    def specs(self, definitions: list[TaskDefinition], *, complete: bool) -> list[TaskSpec]:
        """Build the specs of *definitions* and bring their rows in step with the code."""
        now = self.clock()
        threshold = self.conf.misfire_threshold
        built = [(d, d.trigger(self.default_zone, threshold)) for d in definitions]
        states = state.sync_tasks(
            [(d.name, t) for d, t in built], now=now, using=self.using, complete=complete
        )
        return [TaskSpec(d, t, self._lock_config(d), states[d.name]) for d, t in built]

    def _lock_config(self, definition: TaskDefinition) -> LockConfiguration | None:
        if not definition.lock:
            return None
        most = definition.lock_at_most_for or self.conf.lock_at_most_for
        least = definition.lock_at_least_for
        if least is None:
            least = min(self.conf.lock_at_least_for, most)
        return LockConfiguration(definition.name, most, least)

    def first_fire_time(self, entry: Entry, *, now: datetime) -> datetime | None:
        spec: TaskSpec = entry.payload
        return spec.trigger.next_fire_time(now=now, state=spec.state)

    # -- one firing ----------------------------------------------------------------------------

    def run(self, entry: Entry, fire_time: datetime | None) -> datetime | None:
        spec: TaskSpec = entry.payload
        close_old_connections()
        try:
            if spec.lock_config is None:
                return self._run_unlocked(spec, fire_time)
            return self._run_locked(spec, fire_time)
        finally:
            close_old_connections()
            # What a task activated on this thread must not leak into the next task on it.
            translation.deactivate()
            timezone.deactivate()

    def _run_unlocked(self, spec: TaskSpec, fire_time: datetime | None) -> datetime | None:
        row = self._read_row(spec)
        if row is not None and row.paused and fire_time is not None:
            return self._skip(spec, fire_time, "paused", advance=True)
        if fire_time is not None:
            spec.state = replace(spec.state, last_fire_time=fire_time)
        self._execute(spec, fire_time, claim=False)
        return spec.trigger.next_fire_time(now=self.clock(), state=spec.state)

    def _run_locked(self, spec: TaskSpec, fire_time: datetime | None) -> datetime | None:
        assert spec.lock_config is not None
        try:
            lock = self.provider.lock(spec.lock_config)
        except LockError as exc:
            return self._database_down(spec, fire_time, exc)
        if lock is None:
            return self._skip(spec, fire_time, "locked", advance=True)
        held = KeptAliveLock(lock, self.timer, spec.name)
        try:
            row = self._read_row(spec)
            spec.failures = 0
            if row is None:
                state.ensure_row(spec.name, spec.trigger, now=self.clock(), using=self.using)
                row = self._read_row(spec)
            spec.state = row.state if row is not None else spec.state
            if fire_time is None:  # a manual run
                self._execute(spec, None, claim=False)
                return spec.trigger.next_fire_time(now=self.clock(), state=spec.state)
            now = self.clock()
            due = spec.trigger.next_fire_time(now=now, state=spec.state)
            if due is None or due > now:
                self._skip(spec, fire_time, "already run", advance=False)
                return due
            if row is not None and row.paused:
                state.claim(spec.name, due, using=self.using, run_id=None, next_fire_time=None)
                spec.state = replace(spec.state, last_fire_time=due)
                self._skip(spec, due, "paused", advance=False)
                return self._next(spec)
            self._execute(spec, due, claim=True)
            return self._next(spec)
        except Exception as exc:
            if _is_database_error(exc):
                return self._database_down(spec, fire_time, exc)
            raise
        finally:
            held.release()

    def _next(self, spec: TaskSpec) -> datetime | None:
        return spec.trigger.next_fire_time(now=self.clock(), state=spec.state)

    def _read_row(self, spec: TaskSpec) -> state.TaskRow | None:
        return state.read_row(spec.name, using=self.using)

    def _execute(self, spec: TaskSpec, fire_time: datetime | None, *, claim: bool) -> None:
        """Record the run, claim *fire_time* when asked, call the task and record its end."""
        definition = spec.definition
        started = self.clock()
        run_id = self._record_start(spec, fire_time, started)
        planned: datetime | None = None
        if claim:
            assert fire_time is not None
            planned = spec.trigger.next_fire_time(
                now=started, state=replace(spec.state, last_fire_time=fire_time)
            )
            if not state.claim(
                spec.name, fire_time, using=self.using, run_id=run_id, next_fire_time=planned
            ):
                # Cannot happen while the lock is held; never run a firing twice if it does.
                self._record_end(run_id, RunStatus.LOST, started, error=("", "claim lost", ""))
                return
            spec.state = replace(spec.state, last_fire_time=fire_time)
        with self._runs_lock:
            if run_id is not None:
                self._running_runs[spec.name] = run_id
        common = {"task": definition, "scheduled_at": fire_time, "run": run_id}
        _send(signals.run_started, spec.name, **common)
        logger.info("Running %s (scheduled for %s)", spec.name, _when(fire_time))
        begun = time.perf_counter()
        _context.fire_time = fire_time
        try:
            if definition.is_async:
                asyncio.run(definition.func())
            else:
                definition.func()
        except (Exception, SystemExit) as exc:  # sys.exit() in a task fails that run only
            duration = timedelta(seconds=time.perf_counter() - begun)
            logger.exception("Task %s failed after %s", spec.name, _ms(duration))
            _drop_broken_connections()
            error = (
                f"{type(exc).__module__}.{type(exc).__qualname__}",
                str(exc),
                traceback.format_exc(),
            )
            self._finish(spec, run_id, RunStatus.FAILED, started, planned, error=error)
            _send(signals.run_failed, spec.name, exception=exc, duration=duration, **common)
        else:
            duration = timedelta(seconds=time.perf_counter() - begun)
            logger.info("Task %s succeeded in %s", spec.name, _ms(duration))
            self._finish(spec, run_id, RunStatus.SUCCEEDED, started, planned)
            _send(signals.run_succeeded, spec.name, duration=duration, **common)
        finally:
            _context.fire_time = None

    def _finish(
        self,
        spec: TaskSpec,
        run_id: int | None,
        status: RunStatus,
        started: datetime,
        planned: datetime | None,
        *,
        error: tuple[str, str, str] = ("", "", ""),
    ) -> None:
        """Record the end of a run; the task row only when the claim did not say it all."""
        finished = self._record_end(run_id, status, started, error=error)
        spec.state = replace(spec.state, last_finished=finished)
        with self._runs_lock:
            self._running_runs.pop(spec.name, None)
        next_time = self._next(spec)
        claimed = planned is not None
        # A claim already stored the run and the planned next fire time; only a fixed-delay
        # task (whose next start depends on this finish), a run that overran its next fire
        # time, or a run without a claim (manual, unlocked) needs another write.
        if spec.trigger.kind == "fixed_delay" or not claimed or next_time != planned:
            state.record_finish(
                spec.name,
                using=self.using,
                finished_at=finished if spec.lock_config is not None else None,
                next_fire_time=next_time,
                run_id=None if claimed else run_id,
            )

    # -- history -------------------------------------------------------------------------------

    def _record_start(
        self, spec: TaskSpec, fire_time: datetime | None, started: datetime
    ) -> int | None:
        if not self.conf.history:
            return None
        return history.record_start(
            using=self.using,
            task_name=spec.name,
            fire_time=fire_time,
            started=started,
            instance=self.conf.instance_name,
        )

    def _record_end(
        self,
        run_id: int | None,
        status: RunStatus,
        started: datetime,
        *,
        error: tuple[str, str, str] = ("", "", ""),
    ) -> datetime:
        finished = self.clock()
        if run_id is not None:
            history.record_end(
                using=self.using,
                run_id=run_id,
                status=status,
                started=started,
                finished=finished,
                error=error,
            )
        return finished

    # -- skips, rejections and outages ---------------------------------------------------------

    def _skip(
        self, spec: TaskSpec, fire_time: datetime | None, reason: str, *, advance: bool
    ) -> datetime | None:
        """Count and signal a skipped firing; with *advance*, return the next one to try."""
        self.skipped += 1
        logger.debug("Skipped %s at %s: %s", spec.name, _when(fire_time), reason)
        self._signal_skip(spec, fire_time, reason)
        if not advance:
            return None
        if fire_time is None:
            return spec.trigger.next_fire_time(now=self.clock(), state=spec.state)
        # Someone else runs (or ran) this fire time: look again at the next one.
        now = self.clock()
        assumed = replace(spec.state, last_fire_time=fire_time, last_finished=now)
        spec.state = assumed
        return spec.trigger.next_fire_time(now=now, state=assumed)

    def _database_down(
        self, spec: TaskSpec, fire_time: datetime | None, exc: BaseException
    ) -> datetime:
        spec.failures += 1
        backoff = min(2 ** (spec.failures - 1), _MAX_BACKOFF)
        logger.error(
            "Not running %s (scheduled for %s): the database is unavailable (%s); "
            "trying again in %ss",
            spec.name,
            _when(fire_time),
            exc,
            backoff,
        )
        self._signal_skip(spec, fire_time, "database unavailable")
        return self.clock() + timedelta(seconds=backoff)

    def _signal_skip(self, spec: TaskSpec, fire_time: datetime | None, reason: str) -> None:
        _send(
            signals.run_skipped,
            spec.name,
            task=spec.definition,
            scheduled_at=fire_time,
            run=None,
            reason=reason,
        )

    def rejected(self, entry: Entry, fire_time: datetime | None, stats: PoolStats) -> None:
        spec: TaskSpec = entry.payload
        logger.warning(
            "The pool rejected %s (scheduled for %s): %s", spec.name, _when(fire_time), stats
        )
        if self.conf.history:
            try:
                history.record_rejection(
                    using=self.using,
                    task_name=spec.name,
                    fire_time=fire_time,
                    now=self.clock(),
                    instance=self.conf.instance_name,
                    reason=f"rejected by the pool: {stats}",
                )
            except Exception as exc:
                if not _is_database_error(exc):
                    raise
                logger.warning("Could not record the rejection of %s: %s", spec.name, exc)
            finally:
                close_old_connections()
        self._signal_skip(spec, fire_time, "rejected")

    def next_after_rejection(self, entry: Entry, fire_time: datetime | None) -> datetime | None:
        spec: TaskSpec = entry.payload
        if fire_time is None:
            return entry.next_fire_time
        spec.state = replace(spec.state, last_fire_time=fire_time, last_finished=self.clock())
        return self._next(spec)

    def interrupted(self, names: list[str]) -> None:
        """Mark the runs of *names*, still running at shutdown, as interrupted."""
        with self._runs_lock:
            run_ids = [self._running_runs[name] for name in names if name in self._running_runs]
        history.mark_interrupted(using=self.using, run_ids=run_ids, now=self.clock())


def _drop_broken_connections() -> None:
    """Close the connections a failed task left unusable, so its run can still be recorded.

    Unlike ``close_old_connections()``, this keeps healthy connections open in the middle of a
    firing; the full hygiene runs at the start and the end of every firing.
    """
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred and not conn.is_usable():
            conn.close()


def _send(signal: Any, sender: str, **kwargs: Any) -> None:
    try:
        signal.send(sender=sender, **kwargs)
    except Exception:
        logger.exception("A receiver of %s failed for %s", signal, sender)


def _ms(duration: timedelta) -> str:
    return f"{duration.total_seconds() * 1000:.1f} ms"


def _when(fire_time: datetime | None) -> str:
    return "now (manual run)" if fire_time is None else fire_time.isoformat()


def _is_database_error(exc: BaseException) -> bool:
    from django.db import DatabaseError

    return isinstance(exc, DatabaseError | LockError)
