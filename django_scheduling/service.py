"""Put the parts together: the registry's tasks, the runner and the scheduler, as one service
that ``AppConfig.ready()`` (autostart) and ``manage.py runscheduler`` start and stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from datetime import datetime

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone

from . import history, state
from .clock import utcnow
from .conf import SchedulingSettings, get_settings
from .execution import TaskRunner, TaskSpec
from .locking import SUPPORTED_VENDORS, LockConfiguration, LockError, get_lock_provider
from .models import ScheduledTask
from .registry import TaskDefinition, TaskRegistry, registry
from .scheduler import Entry, Scheduler

__all__ = ["SchedulerService", "POLL_INTERVAL", "HOUSEKEEPING_INTERVAL"]

logger = logging.getLogger(__name__)

#: How often each instance looks for "run now" requests from the admin, in seconds.
POLL_INTERVAL = 1.0
#: How often one of the instances prunes history and marks lost runs, in seconds.
HOUSEKEEPING_INTERVAL = 60.0
_HOUSEKEEPING_LOCK = "django_scheduling.housekeeping"


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
        self.definitions = list(self.tasks if definitions is None else definitions)
        self.core_pool_size = core_pool_size
        self.max_pool_size = max_pool_size
        self.scheduler: Scheduler | None = None
        self.runner: TaskRunner | None = None
        self.specs: list[TaskSpec] = []
        self._stopped = threading.Event()
        self._start_lock = threading.Lock()
        self._last_housekeeping = 0.0

    def check(self) -> None:
        """Raise ``ImproperlyConfigured`` for mistakes in the tasks or settings; no I/O."""
        errors = self.tasks.errors()
        if errors:
            raise ImproperlyConfigured(
                "django_scheduling cannot start; fix these tasks first (manage.py check "
                "shows them too):\n  " + "\n  ".join(errors)
            )
        vendor = connections[self.conf.database].vendor
        if vendor not in SUPPORTED_VENDORS:
            raise ImproperlyConfigured(
                f"django_scheduling supports MySQL/MariaDB, PostgreSQL and SQLite, not {vendor}; "
                "set SCHEDULING['DATABASE'] to an alias of a supported database"
            )

    def start(self) -> None:
        """Check the tasks, sync their rows and start firing."""
        with self._start_lock:
            if self._stopped.is_set():
                return
            self._start()

    def _start(self) -> None:
        self.check()
        conf = self.conf
        core = conf.core_pool_size if self.core_pool_size is None else self.core_pool_size
        most = conf.max_pool_size if self.max_pool_size is None else self.max_pool_size
        self.runner = TaskRunner(
            conf=conf, provider=get_lock_provider(), default_zone=timezone.get_default_timezone()
        )
        self.specs = self.runner.specs(self.definitions, complete=self.complete)
        self.scheduler = Scheduler(
            self.runner,
            core_pool_size=core,
            max_pool_size=max(most, core, 1),
            queue_capacity=conf.queue_capacity,
            keep_alive=conf.keep_alive.total_seconds(),
            rejection_policy=conf.rejection_policy,
        )
        first_times = {spec.name: self.scheduler.add(Entry(spec.name, spec)) for spec in self.specs}
        state.publish_next_fire_times(first_times, using=conf.database)
        close_old_connections()
        self.runner.timer = self.scheduler.timer  # before the first firing can run
        self.scheduler.start()
        self._schedule_poll()
        logger.info("Scheduler started with %d task(s) as %s", len(self.specs), conf.instance_name)

    def next_fire_times(self) -> dict[str, datetime | None]:
        assert self.scheduler is not None
        return {entry.name: entry.next_fire_time for entry in self.scheduler.entries()}

    def start_in_background(self) -> threading.Thread:
        """Start on a thread of its own, retrying while the database cannot be reached.

        ``AppConfig.ready()`` must not touch the database, and a web process should come up
        even when the database is not there yet: the scheduler then starts when it is.
        """
        self.check()

        def run() -> None:
            delay = 1.0
            while not self._stopped.is_set():
                try:
                    self.start()
                    return
                except (DatabaseError, LockError) as exc:
                    logger.error(
                        "Cannot start the scheduler: the database is unavailable (%s); "
                        "trying again in %ss",
                        exc,
                        delay,
                    )
                    close_old_connections()
                    self._stopped.wait(delay)
                    delay = min(delay * 2, 60.0)

        thread = threading.Thread(target=run, name="scheduling-start", daemon=True)
        thread.start()
        return thread

    def stop(self, timeout: float | None = None) -> list[str]:
        """Stop firing, wait for running tasks and return the names still running."""
        if self._stopped.is_set():
            return []
        self._stopped.set()
        with self._start_lock:  # let a start under way finish first
            if self.scheduler is None:
                return []
        wait = self.conf.shutdown_timeout.total_seconds() if timeout is None else timeout
        still_running = self.scheduler.shutdown(timeout=wait)
        if still_running:
            logger.warning(
                "Shutdown timed out after %ss with task(s) still running: %s",
                wait,
                ", ".join(still_running),
            )
            try:
                assert self.runner is not None
                self.runner.interrupted(still_running)
            except DatabaseError as exc:
                logger.warning("Could not mark the interrupted runs: %s", exc)
        close_old_connections()
        logger.info("Scheduler stopped")
        return still_running

    # -- polling, on the scheduler's timer thread ----------------------------------------------

    def _schedule_poll(self) -> None:
        if self.scheduler is not None:
            self.scheduler.timer.call_at(time.monotonic() + POLL_INTERVAL, self._poll)

    def _poll(self) -> None:
        if self._stopped.is_set():
            return
        try:
            close_old_connections()
            self._take_run_requests()
            if time.monotonic() - self._last_housekeeping >= HOUSEKEEPING_INTERVAL:
                self._last_housekeeping = time.monotonic()
                # On a worker, not here: this thread also keeps running tasks' locks alive.
                assert self.scheduler is not None
                try:
                    self.scheduler.pool.submit(self._housekeeping_guarded, label="housekeeping")
                except RuntimeError:  # the pool is full (RejectedWork) or shutting down
                    logger.info("Housekeeping postponed: the worker pool is busy")
        except (DatabaseError, LockError) as exc:
            logger.warning("Polling for run requests failed: %s", exc)
        finally:
            close_old_connections()
            self._schedule_poll()

    def _take_run_requests(self) -> None:
        assert self.scheduler is not None
        manager = ScheduledTask.objects.using(self.conf.database)
        names = {spec.name for spec in self.specs}
        requested = manager.filter(run_requested_at__isnull=False).values_list(
            "name", "run_requested_at"
        )
        for name, requested_at in requested:
            if name not in names:
                continue
            # Only the instance whose update clears the request runs it.
            taken = manager.filter(name=name, run_requested_at=requested_at).update(
                run_requested_at=None
            )
            if taken:
                logger.info("Running %s now, as asked at %s", name, requested_at)
                self.scheduler.run_now(name)

    def _housekeeping_guarded(self) -> None:
        try:
            self._housekeeping()
        except (DatabaseError, LockError) as exc:
            logger.warning("Housekeeping failed: %s", exc)
        finally:
            close_old_connections()

    def _housekeeping(self) -> None:
        provider = get_lock_provider()
        interval = HOUSEKEEPING_INTERVAL
        config = LockConfiguration(_HOUSEKEEPING_LOCK, interval * 5, interval * 0.9)
        lock = provider.lock(config)
        if lock is None:
            return
        try:
            now = utcnow()
            lost = history.mark_lost_runs(now=now, using=self.conf.database)
            pruned = history.prune(
                older_than=now - self.conf.history_retention, using=self.conf.database
            )
            if lost or pruned:
                logger.info(
                    "Housekeeping: %d lost run(s) marked, %d old run(s) pruned", lost, pruned
                )
        finally:
            lock.unlock()
