"""The maintenance thread of a running scheduler.

Once a second it writes what waits in the outbox, queues the runs asked for in the admin
("run now") and the recoveries of lost runs, applies the schedules changed in the database
(every ``SCHEDULES_POLL_INTERVAL``), and, when a database outage is over, makes every
task that backs off try again at once. Once per ``HOUSEKEEPING_INTERVAL`` it frees the locks of
dead processes of this host, and one instance marks lost runs, asks for their recovery
(``recover=True``), prunes the history and deletes the rows of instances gone for a day. Once
per ``HEARTBEAT_INTERVAL`` it records this instance's heartbeat. None of this runs on the
dispatcher or on the keep-alive thread, and a pass waits while a burst of firings is being
started (``bursts``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections
from django.db.models import F, Q, QuerySet

from .. import process
from ..bursts import bursts
from ..clock import utcnow
from ..conf import SchedulingSettings
from ..locking import LockConfiguration, LockError, get_lock_provider
from ..models import ScheduledTask, TaskLock
from ..observability import metrics
from ..observability.outcomes import OutcomeWatch
from ..storage import history, instances
from ..storage.connections import KeptConnection
from ..storage.sql import DatabaseUtcNow
from ..tasks.registry import TaskDefinition
from .outbox import Outbox
from .scheduler import RunRequest, Scheduler

if TYPE_CHECKING:
    from .database_schedules import DatabaseSchedules
    from .firing import FiringPipeline

__all__ = ["Maintenance", "POLL_INTERVAL", "free_locks_of_dead_processes", "request_recoveries"]

logger = logging.getLogger(__name__)

#: How often each instance looks for "run now" requests and pending writes, in seconds.
POLL_INTERVAL = 1.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOUSEKEEPING_LOCK = "django_scheduling.housekeeping"


class Maintenance:
    """The maintenance thread of one scheduler service."""

    def __init__(
        self,
        *,
        conf: SchedulingSettings,
        scheduler: Scheduler,
        pipeline: FiringPipeline | None,
        outbox: Outbox,
        tasks: Mapping[str, TaskDefinition],
        definitions: Mapping[str, TaskDefinition] | None = None,
        schedules: DatabaseSchedules | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.conf = conf
        self.scheduler = scheduler
        self.pipeline = pipeline
        self.outbox = outbox
        #: The tasks this service schedules, and every task the code declares.
        self.tasks = tasks
        self.definitions = tasks if definitions is None else definitions
        #: The schedules in the database, read every ``SCHEDULES_POLL_INTERVAL``.
        self.schedules = schedules
        self.clock = clock
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="scheduling-maintenance", daemon=True
        )
        self._next_housekeeping = 0.0  # the first pass comes at once
        self._next_heartbeat = 0.0
        # Read at start already: the first look comes one interval later.
        self._next_schedules = time.monotonic() + conf.schedules_poll_interval.total_seconds()
        self.started_at = clock()
        self._failing = False
        self.outcomes = OutcomeWatch(using=conf.database, instance=conf.instance_name)
        # Kept open between passes, as the claim threads and the writer keep theirs: under
        # the default CONN_MAX_AGE = 0 each pass connected anew, once a second (on
        # PostgreSQL a new server process each time).
        self._connection = KeptConnection(conf.database)
        #: When the last pass ended, on the ``time.monotonic()`` clock (the liveness probe).
        self.last_pass = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the maintenance thread runs."""
        return self._thread.is_alive()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Ask the thread to stop, and wait up to *timeout* seconds (0: do not wait) for a pass
        under way to end."""
        self._stopped.set()
        if timeout and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            while not self._stopped.is_set():
                bursts.wait()  # the workers first, while they start a burst
                self.tick(time.monotonic())
                self._stopped.wait(POLL_INTERVAL)
        finally:
            connections.close_all()  # this thread's own, kept open until now

    def tick(self, monotonic: float) -> None:
        """Make one pass; *monotonic* decides whether housekeeping is due."""
        using = self.conf.database
        if self.pipeline is not None:
            # No I/O: a run past its timeout is reported even while the database is away.
            self.pipeline.watch_timeouts(monotonic)
        try:
            with self._connection.use():
                self._pass(using, monotonic)
            if self._failing:
                logger.warning("Maintenance works again: the database answers")
            self._failing = False
        except (DatabaseError, LockError) as exc:
            # Once per outage at WARNING; the firings log their own attempts.
            log = logger.debug if self._failing else logger.warning
            log("Maintenance pass failed, the database is unavailable: %s", exc)
            self._failing = True
        except Exception:
            logger.exception("Maintenance pass failed")
        finally:
            _close_others(using)
            self.last_pass = time.monotonic()

    def _pass(self, using: str, monotonic: float) -> None:
        """The database work of a pass, on this thread's kept connection."""
        self.outbox.flush()
        self._take_requests()
        if self.schedules is not None and monotonic >= self._next_schedules:
            assert self.pipeline is not None
            self._next_schedules = monotonic + self.conf.schedules_poll_interval.total_seconds()
            self.schedules.refresh(self.scheduler, self.pipeline, now=self.clock())
        outage = None if self.pipeline is None else self.pipeline.outage
        # Wake the tasks that back off only when this thread saw the database fail too, and
        # now answer: a database that answers reads but fails the firings' writes (a
        # read-only failover) must leave them to their back-off, not retry every second.
        if outage is not None and outage.is_set() and self._failing:
            outage.clear()
            woken = self.scheduler.wake(lambda entry: entry.payload.database_failures > 0)
            if woken:
                logger.warning(
                    "The database answers again: %d task(s) that waited try now", len(woken)
                )
        if monotonic >= self._next_housekeeping:
            self._next_housekeeping = monotonic + self.conf.housekeeping_interval.total_seconds()
            free_locks_of_dead_processes(using=using)
            self.housekeeping()
        if monotonic >= self._next_heartbeat:
            self._next_heartbeat = monotonic + self.conf.heartbeat_interval.total_seconds()
            self.beat()
        if self.conf.history:
            self.outcomes.tick(monotonic)
        self._sample_metrics()

    def _sample_metrics(self) -> None:
        """Record the pool's gauges, and count the overdue tasks now and then (see
        ``metrics``); nothing without prometheus_client."""
        pool = getattr(self.scheduler, "pool", None)
        if pool is not None:
            metrics.pool_sampled(pool.stats())
        metrics.outbox_sampled(len(self.outbox), self.outbox.set_aside)
        metrics.refresh_overdue(every=metrics.OVERDUE_REFRESH)

    def beat(self) -> None:
        """Record this instance's heartbeat (see ``health``). A failed write waits for the
        next one: it must not count as the database failing this pass, which would wake the
        tasks that back off from a database that takes reads but fails writes."""
        try:
            instances.beat(
                name=self.conf.instance_name,
                host=process.hostname(),
                started_at=self.started_at,
                now=self.clock(),
                using=self.conf.database,
                outbox_pending=len(self.outbox),
                outbox_set_aside=self.outbox.set_aside,
            )
        except DatabaseError as exc:
            logger.debug("Could not record the heartbeat: %s", exc)

    def _take_requests(self) -> None:
        """Queue the runs asked for in the rows: "run now", and the recovery of lost runs.

        A request stays in its row until a run takes it (``execution``), so one that could not
        run yet (the lock held elsewhere, a database blip) is queued again next time.
        """
        for name, requested_at, recover_run_id in requested_runs(using=self.conf.database):
            if name not in self.tasks:
                continue
            if recover_run_id is not None:
                self.scheduler.run_now(name, RunRequest(recover_run_id=recover_run_id))
            if requested_at is not None:
                self.scheduler.run_now(name, RunRequest(requested_at=requested_at))

    def housekeeping(self) -> None:
        """On one instance at a time: mark lost runs, ask for recoveries, prune the history."""
        interval = self.conf.housekeeping_interval
        config = LockConfiguration(HOUSEKEEPING_LOCK, interval * 5, interval * 0.9)
        lock = get_lock_provider().lock(config)
        if lock is None:
            return
        using = self.conf.database
        try:
            now = self.clock()
            lost = history.mark_lost_runs(now=now, using=using)
            recovering = request_recoveries(lost, self.definitions, using=using)
            pruned = history.prune(older_than=now - self.conf.history_retention, using=using)
            instances.forget_old_instances(now=now, using=using)
            if lost or pruned:
                logger.info(
                    "Housekeeping: %d lost run(s) marked (%d to recover), %d old run(s) pruned",
                    len(lost),
                    recovering,
                    pruned,
                )
        finally:
            lock.unlock()


def requested_runs(
    *, using: str
) -> QuerySet[ScheduledTask, tuple[str, datetime | None, int | None]]:
    """Return the name, "run now" time and lost run to recover of the rows that ask for a run.

    Every instance polls this every second: it searches two indexes for the few rows set, and
    never reads the whole table (nor, on SQLite, keeps it in the page cache).
    """
    return (
        ScheduledTask.objects.using(using)
        # Ranges, not IS NOT NULL, which SQLite's planner answers by reading the whole table.
        .filter(Q(run_requested_at__gte=_EPOCH) | Q(recover_run_id__gte=1))
        .order_by()
        .values_list("name", "run_requested_at", "recover_run_id")
    )


def request_recoveries(
    lost: list[tuple[int, str, int | None]], tasks: Mapping[str, TaskDefinition], *, using: str
) -> int:
    """Ask for a run again of each lost run of a task with ``recover=True``; return how many.

    A recovery run that is lost itself is not recovered again: a task that kills its process
    must not do so over and over.
    """
    count = 0
    for run_id, name, recovery_of in lost:
        definition = tasks.get(name)
        if definition is None or not definition.recover or recovery_of is not None:
            continue
        manager = ScheduledTask.objects.using(using)
        if manager.filter(name=name, recover_run__isnull=True).update(recover_run=run_id):
            logger.warning("Run %s of %s was lost; it runs again (recover=True)", run_id, name)
            count += 1
    return count


def free_locks_of_dead_processes(*, using: str) -> list[str]:
    """Free the locks held by processes of this host that have died; return their names.

    A restarted process (a dev server after Ctrl-C, a killed worker) thus does not wait
    ``lock_at_most_for`` for the locks its predecessor held. Only owners in the default
    ``host:pid:start`` form are judged (see ``process``), each once: a scheduler of 10,000
    tasks holds thousands of locks at a time, under a handful of owners. A dead owner's locks
    are freed ``FREE_CHUNK`` at a time, with one warning for each owner. Two schedulers of
    one host that free the same dead owner's locks at once may both report a lock that one
    of them freed (see ``_free``).
    """
    held = TaskLock.objects.using(using).filter(
        locked_by__startswith=f"{process.hostname()}:", lock_until__gt=DatabaseUtcNow()
    )
    owners = held.order_by().values_list("locked_by", flat=True).distinct()
    freed: list[str] = []
    for owner in [owner for owner in owners if process.is_dead_local(owner)]:
        names = sorted(held.filter(locked_by=owner).values_list("name", flat=True))
        mine: list[str] = []
        for first in range(0, len(names), FREE_CHUNK):
            mine += _free(using, owner, names[first : first + FREE_CHUNK])
        if mine:
            shown = ", ".join(mine[:_NAMES_SHOWN])
            more = f" and {len(mine) - _NAMES_SHOWN} more" if len(mine) > _NAMES_SHOWN else ""
            logger.warning(
                "Freed %d lock(s) held by %s, which has died: %s%s", len(mine), owner, shown, more
            )
        freed += mine
    return freed


#: The locks of a dead process freed by one statement.
FREE_CHUNK = 500
#: The names a warning about freed locks shows.
_NAMES_SHOWN = 10


def _free(using: str, owner: str, names: list[str]) -> list[str]:
    """Free the locks *names* that the dead *owner* still holds; return the names freed.

    A lock that expired meanwhile is left alone. When another scheduler of this host frees
    the same locks at the same moment, each may count a lock the other freed."""
    locks = TaskLock.objects.using(using).filter(name__in=names, locked_by=owner)
    count = locks.filter(lock_until__gt=DatabaseUtcNow()).update(lock_until=F("locked_at"))
    if count == len(names):
        return names
    return sorted(locks.filter(lock_until=F("locked_at")).values_list("name", flat=True))


def _close_others(using: str) -> None:
    """Close this thread's connections to other databases than *using* as Django does after a
    request (``CONN_MAX_AGE``), should a pass have opened one."""
    for conn in connections.all(initialized_only=True):
        if conn.alias != using:
            conn.close_if_unusable_or_obsolete()
