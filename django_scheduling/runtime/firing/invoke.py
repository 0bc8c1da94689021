"""Invoke a task in-process: call it on a worker thread, retry it as ``retries=`` allows, and
watch it against its timeout.

A run is noted as running here while it is called, so that a shutdown that times out can mark
it interrupted, and the maintenance thread can report it once it passes its timeout. Its end
goes to the ``Recorder``.
"""

from __future__ import annotations

import asyncio
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

from django.db import close_old_connections

from ... import signals
from ...context import RunTimedOut, set_firing
from ...models import RunStatus
from ...observability.events import run_events
from ...schedules.decisions import retry_delay
from ...schedules.durations import format_duration
from ...tasks.commands import CommandFailed, CommandOutput
from ...tasks.definition import TaskDefinition
from ..calls import Done
from .contention import LOCKED_REPORT_AFTER, when
from .record import NO_ERROR, Error, HandOver, Recorder
from .runs import ClaimedRun
from .spec import TaskSpec

__all__ = ["Invoker", "Underway", "retry_bound"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Running:
    """A run under way on a worker thread of this process."""

    run_id: int | None
    run: ClaimedRun
    #: When it passes its timeout, on the ``time.monotonic()`` clock; None: no timeout.
    deadline: float | None = None
    timeout: timedelta | None = None
    #: Its timeout has been reported (``watch_timeouts``).
    reported: bool = False
    #: When it started, on the ``time.monotonic()`` clock.
    begun: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class _Ended:
    """How an attempt ended: its status, error, duration, exception and finish."""

    status: RunStatus
    error: Error
    duration: timedelta
    exc: BaseException | None
    finished: datetime
    #: What a management command wrote (see ``tasks.commands``); other tasks keep none.
    output: str = ""


class Underway:
    """The runs of this process: claimed and waiting to start, and running, by task name.

    The worker threads change the two tables one key at a time, with no lock of their own: a
    dict's single store or pop is atomic (under the GIL, and by the dict's own lock in a
    free-threaded build), and the readers work on a copy. A lock taken here three times per
    run made the workers of a burst queue on it, each handing the GIL over as it waited:
    1,000 ``lock=False`` tasks due every second (``benchmarks/bench_end_to_end.py``, SQLite)
    cost each of the four workers about 1,800 voluntary context switches in 10 s with it, and
    about 60 without. The lock orders what is not one step: a burst's claims added, the
    table emptied, the runs taken at a shutdown.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claimed: dict[str, ClaimedRun] = {}
        self._running: dict[str, _Running] = {}

    def add_claimed(self, runs: list[ClaimedRun]) -> None:
        with self._lock:
            for run in runs:
                self._claimed[run.spec.name] = run

    def started(self, name: str) -> None:
        """The claimed run of *name* starts (or is handed to its engine)."""
        claimed = self._claimed
        claimed.pop(name, None)
        if not claimed:
            with self._lock:  # not while a batch of claims is being added
                if not claimed:
                    claimed.clear()  # frees the table a burst grew (a pop never shrinks it)

    def begin(self, name: str, running: _Running) -> None:
        """The task *name* is being called."""
        self._running[name] = running

    def end(self, name: str) -> None:
        self._running.pop(name, None)

    def running(self) -> dict[str, _Running]:
        """The runs being called now (a copy)."""
        return self._running.copy()

    def durations(self) -> dict[str, float]:
        now = time.monotonic()
        return {name: now - running.begun for name, running in self.running().items()}

    def take(self, names: list[str]) -> tuple[list[_Running], list[ClaimedRun]]:
        """Return the runs of *names* being called, and take those claimed that never
        started (a shutdown: the pool has stopped)."""
        running = self.running()
        with self._lock:
            claimed = [self._claimed.pop(name, None) for name in names]
        return (
            [running[name] for name in names if name in running],
            [run for run in claimed if run is not None],
        )


class Invoker(HandOver):
    """Call claimed tasks in-process, on the pool's worker threads."""

    def __init__(
        self,
        *,
        recorder: Recorder,
        underway: Underway,
        stopping: threading.Event,
        clock: Callable[[], datetime],
    ) -> None:
        super().__init__(recorder=recorder, underway=underway, clock=clock)
        self.stopping = stopping

    def run(self, run: ClaimedRun, done: Done) -> None:
        """Call the claimed *run* (on a worker thread) and hand its end to the recorder."""
        self.underway.started(run.spec.name)
        started = self.clock()
        try:
            close_old_connections()
            try:
                ended, started = self._attempts(run, started)
            finally:
                close_old_connections()
        except BaseException as exc:
            # Whatever escaped (a KeyboardInterrupt, a trigger that raised): the run is over,
            # its lock must not be kept alive, and its task must fire again.
            logger.exception("Finishing the run of %s failed", run.spec.name)
            run.exc = exc
            self.recorder.abandon(run, done, started, (_qualified(type(exc)), str(exc), ""))
            if isinstance(exc, KeyboardInterrupt):
                raise
            return
        run.duration, run.exc = ended.duration, ended.exc
        self.recorder.finish(
            run,
            done,
            status=ended.status,
            started=started,
            finished=ended.finished,
            error=ended.error,
            output=ended.output,
        )

    def _attempts(self, run: ClaimedRun, started: datetime) -> tuple[_Ended, datetime]:
        """Call the task, and again for each retry its ``retries=`` allow; return how the
        last attempt ended, and when it started. The ends of the attempts before it are
        recorded here."""
        spec = run.spec
        definition = spec.definition
        attempt = 1
        bound = retry_bound(spec, run.fire_time, started) if definition.retries else None
        while True:
            ended = self._attempt(spec, run)
            if ended.exc is None or attempt > definition.retries:
                break
            wait = retry_delay(
                attempt, definition.retry_backoff, definition.retry_backoff_max, random.random()
            )
            why_not = self._no_retry_because(run, bound, ended.finished + wait)
            if why_not is not None:
                logger.warning(
                    "Not retrying %s (scheduled for %s) after attempt %d: %s",
                    spec.name,
                    when(run.fire_time),
                    attempt,
                    why_not,
                )
                break
            logger.warning(
                "Attempt %d of %s (scheduled for %s) failed; trying again in %s (%d of %d retries)",
                attempt,
                spec.name,
                when(run.fire_time),
                _ms(wait),
                attempt,
                definition.retries,
            )
            self.recorder.record_attempt_end(
                run, ended.status, started, ended.finished, ended.error, ended.output
            )
            run.duration = ended.duration
            self.recorder.signal_end(run, ended.exc)
            if self.stopping.wait(wait.total_seconds()):
                break
            attempt += 1
            started = self.clock()
            self.recorder.record_attempt_start(run, started, attempt)
        if ended.duration > max(LOCKED_REPORT_AFTER, spec.longest_run):  # only such runs matter
            spec.longest_run = ended.duration
        spec.finished(ended.finished)
        return ended, started

    def _no_retry_because(
        self, run: ClaimedRun, bound: datetime | None, retry_at: datetime
    ) -> str | None:
        """Return why a failed attempt is not tried again at *retry_at*; ``None``: it is."""
        if self.stopping.is_set():
            return "the scheduler is stopping"
        if run.lost:
            return "its lock was lost"
        if bound is not None and retry_at >= bound:
            return (
                f"a retry at {retry_at.isoformat()} would reach the next fire time "
                f"{bound.isoformat()}, which comes first"
            )
        return None

    def _attempt(self, spec: TaskSpec, run: ClaimedRun) -> _Ended:
        """Call the task once, noted as running meanwhile; return how it ended."""
        timeout = spec.timeout
        deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
        self.underway.begin(spec.name, _Running(run.run_id, run, deadline, timeout))
        try:
            return self._call(spec, run, deadline)
        finally:
            self.underway.end(spec.name)

    def _call(self, spec: TaskSpec, run: ClaimedRun, deadline: float | None) -> _Ended:
        """Call the task; a run longer than its timeout ends *timed out*, with a
        ``RunTimedOut`` as its exception."""
        definition, fire_time = spec.definition, run.fire_time
        run_events.publish(
            signals.run_started, spec.name, task=definition, scheduled_at=fire_time, run=run.run_id
        )
        if logger.isEnabledFor(logging.INFO):  # formats the fire time for a line written only
            logger.info("Running %s (scheduled for %s)", spec.name, when(fire_time))
        begun = time.perf_counter()
        failure: BaseException | None = None
        failed_traceback = ""
        output = ""
        try:
            # In a copy of this thread's context: what the task sets in context variables
            # (Django's active translation and time zone among them) ends with its run.
            result = contextvars.copy_context().run(_invoke, definition, fire_time, deadline)
            if isinstance(result, CommandOutput):
                output = result
        except (Exception, SystemExit) as exc:  # sys.exit() in a task fails that run only
            failure = exc
            failed_traceback = traceback.format_exc()
            if isinstance(exc, CommandFailed):
                output = exc.output
        duration = timedelta(seconds=time.perf_counter() - begun)
        # Past its deadline by the clock cancel_requested() reads: a task that saw the request
        # and returned is timed out, whatever its duration measured from a moment later.
        timed_out_now = deadline is not None and time.monotonic() >= deadline
        if failure is not None:
            # A failed task may leave its connection unusable; the run is still recorded.
            close_old_connections()
        if spec.timeout is not None and timed_out_now:
            timed_out = RunTimedOut(spec.name, duration, spec.timeout, failure)
            logger.error("%s", timed_out)
            error = (_qualified(RunTimedOut), str(timed_out), failed_traceback)
            return _Ended(RunStatus.TIMED_OUT, error, duration, timed_out, self.clock(), output)
        if failure is not None:
            logger.error(
                "Task %s failed after %s",
                spec.name,
                _ms(duration),
                exc_info=(type(failure), failure, failure.__traceback__),
            )
            error = (_qualified(type(failure)), str(failure), failed_traceback)
            return _Ended(RunStatus.FAILED, error, duration, failure, self.clock(), output)
        logger.info("Task %s succeeded in %.1f ms", spec.name, duration.total_seconds() * 1000)
        return _Ended(RunStatus.SUCCEEDED, NO_ERROR, duration, None, self.clock(), output)

    def watch_timeouts(self, monotonic: float) -> list[str]:
        """Report, once each, the runs of this process that have passed their timeout by
        *monotonic* (``time.monotonic()``); return their tasks' names. No I/O: the history
        row tells the rest of the world by its ``timeout_at``. Called by one thread (the
        maintenance thread's)."""
        late = [
            (name, running)
            for name, running in self.underway.running().items()
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


def retry_bound(spec: TaskSpec, fire_time: datetime | None, started: datetime) -> datetime | None:
    """Return the fire time that the retries of a run (or the publishes of an enqueue) must
    not reach: the next one of the schedule (``None``: none, as for a fixed delay, which
    counts from the run's end)."""
    if spec.trigger.kind == "fixed_delay":
        return None
    if fire_time is None:  # a manual run: the task's next fire time as things stand
        return spec.trigger.next_fire_time(now=started, state=spec.state)
    after = replace(spec.state, last_fire_time=fire_time)
    return spec.trigger.next_fire_time(now=fire_time, state=after)


def _invoke(definition: TaskDefinition, fire_time: datetime | None, deadline: float | None) -> Any:
    """Call the task, and return what it returned; in a copy of the context made for the
    run, which ends with it."""
    set_firing(fire_time, deadline)
    result = definition.func(*definition.args, **definition.kwargs)
    if inspect.iscoroutine(result):  # an async task: run it to its end on this thread
        return asyncio.run(result)
    return result


def _qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _ms(duration: timedelta) -> str:
    return f"{duration.total_seconds() * 1000:.1f} ms"
