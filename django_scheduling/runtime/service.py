"""Put the parts together, as one service that ``AppConfig.ready()`` (autostart) and
``manage.py runscheduler`` start and stop.

Its threads, each with one job: the scheduler's dispatcher (no I/O) and workers (firings), the
keep-alive thread (lock extensions only) and the maintenance thread (run requests, pending
writes, recovery after an outage, housekeeping).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar, cast

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone

from ..conf import SchedulingSettings, get_settings
from ..locking import LockError, get_lock_provider
from ..observability.deadline import call_with_deadline
from ..observability.events import run_events
from ..storage import task_rows
from ..storage.errors import describe_database_error, is_conflict
from ..tasks import engines
from ..tasks.registry import TaskDefinition, TaskRegistry, registry
from . import maintenance
from .claim_queue import claim_threads_for
from .database_schedules import DatabaseSchedules
from .firing import FiringPipeline, TaskSpec
from .keepalive import KeepAlive
from .outbox import Outbox
from .scheduler import Scheduler
from .writer import EndWriter

__all__ = ["SchedulerService", "Liveness", "current_service"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How often the start-up tries a step that met another instance's writes (a deadlock, a
#: serialization failure) before it gives up.
START_ATTEMPTS = 5
#: How long a second ``stop()`` waits, beyond the shutdown timeout (waited at most twice: for a
#: start under way, then for the running tasks), for the first to write its records.
_STOP_WRITES_TIMEOUT = 10.0
#: While a shutdown waits for running tasks, it says which ones this often, in seconds.
SHUTDOWN_REPORT_EVERY = 5.0
#: The maintenance thread must have ended a pass within this many heartbeat intervals (and
#: at least ``LIVE_MINIMUM`` seconds) for the scheduler to count as alive: a pass that waits on
#: a database that does not answer may take a while, and that is no reason to restart.
LIVE_INTERVALS = 3
LIVE_MINIMUM = 60.0

_current: SchedulerService | None = None
_current_pid: int | None = None


def current_service() -> SchedulerService | None:
    """Return the scheduler service started in this process (by autostart or
    ``runscheduler``), if any."""
    return _current if _current_pid == os.getpid() else None


#: How long the start waits for the engines' brokers (``_warm_up_engines``), in seconds.
WARM_UP_TIMEOUT = 2.0


def _warm_up_engines(definitions: Iterable[TaskDefinition], publishers: int) -> None:
    """Connect to the brokers of the tasks that enqueue, before the first firing, for as many
    publishes at once as may happen: one per worker (*publishers*), and no more than there are
    Celery tasks (see ``engines.warm_up``). A broker that does not answer within
    ``WARM_UP_TIMEOUT`` delays the start by no more: its first publish connects, or fails and
    is retried, as any other."""
    objs = [d.func for d in definitions if d.engine == engines.CELERY]
    if not objs:
        return
    warm_up = functools.partial(engines.warm_up, objs, min(publishers, len(objs)))
    try:
        call_with_deadline(warm_up, timeout=WARM_UP_TIMEOUT)
    except Exception as exc:  # the broker is down or slow: the firings will say so
        logger.warning("Could not connect to the Celery broker at start: %s", exc)


def _make_current(service: SchedulerService) -> None:
    global _current, _current_pid
    _current, _current_pid = service, os.getpid()


@dataclass(frozen=True)
class Liveness:
    """Whether this process's scheduler works: *state* is ``starting``, ``running``,
    ``stopping``, ``stopped`` or ``failed``; *problems* says what is wrong when it is not
    alive."""

    alive: bool
    state: str
    problems: tuple[str, ...] = ()


class SchedulerService:
    """The scheduler of this process, with the tasks it runs."""

    def __init__(
        self,
        definitions: Iterable[TaskDefinition] | None = None,
        *,
        tasks: TaskRegistry | None = None,
        conf: SchedulingSettings | None = None,
        core_pool_size: int | None = None,
        max_pool_size: int | None = None,
    ) -> None:
        self.conf = conf or get_settings()
        self.tasks = registry if tasks is None else tasks
        self.complete = definitions is None
        # The registry is read at start (not copied here: a list per task, for as long as
        # the scheduler runs).
        self._definitions = None if definitions is None else list(definitions)
        self.core_pool_size = core_pool_size
        self.max_pool_size = max_pool_size
        self.scheduler: Scheduler | None = None
        self.pipeline: FiringPipeline | None = None
        self.keepalive: KeepAlive | None = None
        self.writer: EndWriter | None = None
        self.maintenance: maintenance.Maintenance | None = None
        self.schedules: DatabaseSchedules | None = None
        self.outbox = Outbox()
        self._stopped = threading.Event()
        self._stop_done = threading.Event()
        self._start_lock = threading.Lock()
        self._shut_down = False
        self._shut_done = threading.Event()

    def check(self) -> None:
        """Raise ``ImproperlyConfigured`` naming every mistake in the tasks or settings, as
        ``manage.py check`` reports them; no I/O."""
        from ..checks import describe, scheduler_errors

        errors = scheduler_errors(self.tasks, self.conf)
        if errors:
            raise ImproperlyConfigured(
                "django_scheduling cannot start; fix these first (manage.py check shows them "
                "too):\n" + describe(errors)
            )

    def start(self) -> None:
        """Check the tasks, sync their rows and start firing."""
        _make_current(self)
        with self._start_lock:
            if self._stopped.is_set():
                return
            self._start()
            late = self._stopped.is_set()
        if late:
            # A stop came while this start was under way. It may have given up waiting for it
            # (see _stop): stop what the start has just started, unless the stop does.
            self._stop(self.conf.shutdown_timeout.total_seconds())

    def _start(self) -> None:
        self.check()
        conf = self.conf
        core = conf.core_pool_size if self.core_pool_size is None else self.core_pool_size
        most = conf.max_pool_size if self.max_pool_size is None else self.max_pool_size
        self.keepalive = KeepAlive(f"scheduling-keepalive-{os.getpid()}")
        provider = get_lock_provider()
        self.writer = EndWriter(
            using=conf.database,
            provider=provider,
            outbox=self.outbox,
            name=f"scheduling-writer-{os.getpid()}",
        )
        self.pipeline = FiringPipeline(
            conf=conf,
            provider=provider,
            default_zone=timezone.get_default_timezone(),
            keepalive=self.keepalive,
            outbox=self.outbox,
            writer=self.writer,
        )
        pipeline = self.pipeline
        code = self.definitions
        schedules = self.schedules = DatabaseSchedules(
            tasks=self.tasks, conf=conf, only=None if self.complete else [d.name for d in code]
        )
        definitions = self._retrying(
            "reading the schedules in the database", lambda: schedules.load(code)
        )
        specs = self._retrying(
            "syncing the task rows",
            lambda: pipeline.specs(
                definitions,
                complete=self.complete,
                afresh=schedules.stored([d.name for d in definitions]),
            ),
        )
        # A process of this host that died holding locks (a restarted dev server) frees them
        # before the first firing, instead of blocking its tasks for lock_at_most_for.
        self._retrying(
            "freeing the locks of dead processes",
            lambda: maintenance.free_locks_of_dead_processes(using=conf.database),
        )
        self.scheduler = Scheduler(
            self.pipeline,
            core_pool_size=core,
            max_pool_size=max(most, core, 1),
            queue_capacity=conf.queue_capacity,
            keep_alive=conf.keep_alive.total_seconds(),
            rejection_policy=conf.rejection_policy,
            # A thread's kept connections close with it, not whenever it is collected.
            on_thread_exit=connections.close_all,
            claim_threads=claim_threads_for(connections[conf.database].vendor),
        )
        first_times = {spec.name: self.scheduler.add(spec) for spec in specs}
        self._retrying(
            "publishing the next fire times",
            lambda: task_rows.publish_next_fire_times(first_times, using=conf.database),
        )
        _warm_up_engines(definitions, conf.max_pool_size)
        close_old_connections()
        self.keepalive.start()  # before the first firing can run
        self.writer.start()
        self.scheduler.start()
        self.maintenance = maintenance.Maintenance(
            conf=conf,
            scheduler=self.scheduler,
            pipeline=self.pipeline,
            outbox=self.outbox,
            tasks=_Scheduled(self.scheduler),
            # Every declared task, when this instance runs only some of them.
            definitions=None
            if self.complete
            else {definition.name: definition for definition in self.tasks},
            schedules=self.schedules,
        )
        self.maintenance.start()
        logger.info("Scheduler started with %d task(s) as %s", len(specs), conf.instance_name)

    def _retrying(self, step: str, work: Callable[[], T]) -> T:
        """Return what *work* (a step of the start-up, safe to repeat) returns, trying it
        again when it meets another instance's writes.

        Instances that start together write the same rows; a deadlock or a serialization
        failure between them (the database rolled one statement back) is no outage. Other
        database errors, and conflicts inside a transaction of the caller's, are raised.
        """
        for attempt in itertools.count(1):
            try:
                return work()
            except DatabaseError as exc:
                if (
                    attempt == START_ATTEMPTS
                    or not is_conflict(exc)
                    or connections[self.conf.database].in_atomic_block
                ):
                    raise
                # Randomized, so that the instances that met do not meet again in step.
                delay = random.uniform(0.05, 0.25) * attempt
                logger.warning(
                    "Start-up: %s met another instance's writes (%s); trying again in %.2fs",
                    step,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    delay,
                )
            self._stopped.wait(delay)
        raise AssertionError("not reached")  # for type checkers: the loop has no end

    @property
    def definitions(self) -> list[TaskDefinition]:
        """The tasks this service runs: those it was given, or every task of the registry."""
        return list(self.tasks) if self._definitions is None else self._definitions

    @property
    def specs(self) -> list[TaskSpec]:
        """The tasks it runs, once started (each the scheduler's entry)."""
        if self.scheduler is None:
            return []
        return cast(list[TaskSpec], self.scheduler.entries())

    def next_fire_times(self) -> dict[str, datetime | None]:
        assert self.scheduler is not None
        return {entry.name: entry.next_fire_time for entry in self.scheduler.entries()}

    def start_in_background(self) -> threading.Thread:
        """Start on a thread of its own once app loading has finished, retrying until it
        succeeds or ``stop()`` is called.

        ``AppConfig.ready()`` must not touch the database, nor may a thread it starts before
        every app is ready; and a web process should come up even when the database is not
        there yet: the scheduler then starts when it is. Mistakes in the tasks or settings
        raise ``ImproperlyConfigured`` here, at once.
        """
        from django.apps import apps

        self.check()
        _make_current(self)

        def run() -> None:
            # ready() runs while later apps are still loading; wait for the last one.
            while not apps.ready_event.wait(timeout=1.0):
                if self._stopped.is_set():
                    return
            delay = 1.0
            while not self._stopped.is_set():
                try:
                    self.start()
                    return
                except (DatabaseError, LockError) as exc:
                    logger.error(
                        "Cannot start the scheduler: %s; trying again in %ss",
                        describe_database_error(exc),
                        delay,
                    )
                except Exception:
                    # Anything else is a bug or a passing fault; giving up would leave this
                    # process without a scheduler until it restarts.
                    logger.exception("Cannot start the scheduler; trying again in %ss", delay)
                close_old_connections()
                self._stopped.wait(delay)
                delay = min(delay * 2, 60.0)

        thread = threading.Thread(target=run, name="scheduling-start", daemon=True)
        thread.start()
        return thread

    @property
    def stalled_after(self) -> float:
        """How many seconds the maintenance thread may go without ending a pass before the
        scheduler counts as stalled."""
        return max(self.conf.heartbeat_interval.total_seconds() * LIVE_INTERVALS, LIVE_MINIMUM)

    def liveness(self, monotonic: float | None = None) -> Liveness:
        """Return whether this scheduler works, as of *monotonic* (``time.monotonic()``): its
        threads run, and its maintenance thread has ended a pass lately. No I/O."""
        if self._stopped.is_set():
            return Liveness(False, "stopped" if self._stop_done.is_set() else "stopping")
        if self.scheduler is None or self.maintenance is None:
            return Liveness(True, "starting")  # waits for the database; restarting won't help
        monotonic = time.monotonic() if monotonic is None else monotonic
        threads = {
            "dispatcher": self.scheduler.alive,
            "writer": self.writer is not None and self.writer.alive,
            "keep-alive": self.keepalive is not None and self.keepalive.alive,
            "maintenance": self.maintenance.alive,
        }
        problems = [
            f"the {name} thread has stopped" for name, alive in threads.items() if not alive
        ]
        since = monotonic - self.maintenance.last_pass
        if since > self.stalled_after:
            problems.append(f"the maintenance thread has not ended a pass for {since:.0f}s")
        if problems:
            return Liveness(False, "failed", tuple(problems))
        return Liveness(True, "running")

    def stop(self, timeout: float | None = None) -> list[str]:
        """Stop firing, wait for running tasks and return the names still running.

        Runs still going after *timeout* are marked interrupted and their locks released: the
        process is about to exit, and another instance may take the task over at once.
        """
        wait = self.conf.shutdown_timeout.total_seconds() if timeout is None else timeout
        if self._stopped.is_set():
            # Another thread is stopping it (runserver's Ctrl-C, then atexit): let it finish,
            # or the process could exit halfway through its writes.
            self._stop_done.wait(2 * wait + _STOP_WRITES_TIMEOUT)
            if self._shut_down:  # a start that the first gave up waiting for is stopping it
                self._shut_done.wait(2 * wait + _STOP_WRITES_TIMEOUT)
            return []
        self._stopped.set()
        try:
            return self._stop(wait)
        finally:
            self._stop_done.set()

    def _stop(self, wait: float) -> list[str]:
        # Let a start under way finish first, but not for longer than the shutdown may take:
        # a start stuck on an unreachable database must not hold up the process's exit.
        if not self._start_lock.acquire(timeout=wait):
            logger.warning("Stopping while the scheduler was still starting: it stops once started")
            return []
        try:
            if self.scheduler is None:
                return []
            # Once: by stop(), or by a start that a stop gave up waiting for. The other call
            # waits for it, or the process could exit halfway through its writes.
            stopping_elsewhere, self._shut_down = self._shut_down, True
        finally:
            self._start_lock.release()
        if stopping_elsewhere:
            self._shut_done.wait(2 * wait + _STOP_WRITES_TIMEOUT)
            return []
        try:
            return self._shut(wait)
        finally:
            self._shut_done.set()

    def _shut(self, wait: float) -> list[str]:
        assert self.scheduler is not None
        # Stop dispatching first: a maintenance pass that waits on the database must not keep
        # firings coming after a SIGTERM.
        if self.maintenance is not None:
            self.maintenance.stop(timeout=0)
        if self.pipeline is not None:
            self.pipeline.stopping.set()  # a retry that waits gives up
        with self._reporting_waits(wait):
            still_running = self.scheduler.shutdown(timeout=wait)
        if still_running:
            logger.warning(
                "Shutdown timed out after %ss with task(s) still running: %s",
                wait,
                ", ".join(still_running),
            )
            try:
                assert self.pipeline is not None
                self.pipeline.interrupted(still_running)
            except (DatabaseError, LockError) as exc:
                logger.warning("Could not mark the interrupted runs: %s", exc)
        if self.writer is not None:
            self.writer.stop(timeout=min(wait, 5.0))
        # The signals of the last runs go out before the process exits.
        if not run_events.drain(timeout=min(wait, 5.0)):
            logger.warning("Stopped with %d run event(s) not delivered", run_events.pending)
        if self.maintenance is not None:
            self.maintenance.stop(timeout=min(wait, 2.0))  # a daemon thread: do not wait long
        try:
            self.outbox.flush()
        except Exception:
            logger.exception("Writing the pending records at shutdown failed")
        if self.keepalive is not None:
            self.keepalive.stop()
        self._deregister()
        close_old_connections()
        logger.info("Scheduler stopped")
        return still_running

    def _deregister(self) -> None:
        """Remove this instance's heartbeat: the health report counts it gone at once."""
        from ..storage.instances import forget_instance

        try:
            forget_instance(name=self.conf.instance_name, using=self.conf.database)
        except DatabaseError as exc:
            logger.warning("Could not remove this instance's heartbeat: %s", exc)

    @contextlib.contextmanager
    def _reporting_waits(self, wait: float) -> Iterator[None]:
        """Say which runs the shutdown waits for, and for how long, now and every
        ``SHUTDOWN_REPORT_EVERY`` seconds while it waits."""
        pipeline = self.pipeline
        if pipeline is None or not pipeline.running():
            yield
            return
        done = threading.Event()
        deadline = time.monotonic() + wait

        def report() -> None:
            while True:
                running = pipeline.running()
                if not running:
                    return
                left = max(deadline - time.monotonic(), 0.0)
                logger.warning(
                    "Stopping: waiting up to %.0fs more for %d running task(s): %s",
                    left,
                    len(running),
                    ", ".join(
                        f"{name} (running {seconds:.0f}s)" for name, seconds in running.items()
                    ),
                )
                if done.wait(SHUTDOWN_REPORT_EVERY) or left <= 0:
                    return

        thread = threading.Thread(target=report, name="scheduling-shutdown-report", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(1.0)


class _Scheduled(Mapping[str, TaskDefinition]):
    """The definitions of the tasks a scheduler runs, by name, read from its entries (each a
    ``TaskSpec``) rather than kept in a dict of their own."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def __getitem__(self, name: str) -> TaskDefinition:
        spec = self._scheduler.entry(name)
        if spec is None:
            raise KeyError(name)
        return cast(TaskSpec, spec).definition

    def __iter__(self) -> Iterator[str]:
        return iter([entry.name for entry in self._scheduler.entries()])

    def __len__(self) -> int:
        return len(self._scheduler.entries())  # read once, at start
