"""Prometheus metrics of the scheduler, with the optional ``prometheus`` extra.

``install()`` (called from ``AppConfig.ready()``) creates the metrics in prometheus_client's
default registry and connects receivers to the run signals; without prometheus_client it does
nothing. The names and labels are public API:

- ``django_scheduling_runs_total{task, status}``: finished runs, ``status`` is ``succeeded``,
  ``failed``, ``timed_out`` or ``enqueued``;
- ``django_scheduling_run_duration_seconds{task}``: a histogram of run durations;
- ``django_scheduling_lateness_seconds{task}``: a histogram of start minus fire time;
- ``django_scheduling_skipped_total{task, reason}``: firings not run, by ``run_skipped`` reason;
- ``django_scheduling_lock_attempts_total{task, acquired}``: lock attempts, ``acquired`` is
  ``true`` or ``false``;
- ``django_scheduling_last_success_timestamp_seconds{task}``: when the last success ended (an
  engine task: when its worker's success was reported);
- ``django_scheduling_last_enqueued_timestamp_seconds{task}``: when an engine task was last
  enqueued;
- ``django_scheduling_worker_outcomes_total{task, outcome}``: enqueued runs whose outcome on
  the worker the engine reported (``successful``/``failed`` from django.tasks,
  ``success``/``failure``/``revoked`` from Celery);
- ``django_scheduling_overdue_tasks``: overdue tasks, counted in the database at scrape time;
- ``django_scheduling_pool_queue_depth``, ``django_scheduling_pool_busy_threads`` and
  ``django_scheduling_pool_threads``: the worker pool, sampled once a second;
- ``django_scheduling_outbox_pending``: writes waiting for the database (run ends, lock
  releases), and ``django_scheduling_outbox_set_aside``: writes that failed for good and were
  set aside, since the scheduler started; both sampled once a second.

Under prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) every gauge has a
``multiprocess_mode``: the pool gauges add up the live processes, the last success takes the
newest, and the overdue count is the value most recently computed by any process (each
scheduler's maintenance thread counts again every ``OVERDUE_REFRESH`` seconds).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..clock import utcnow
from ..context import RunTimedOut
from .events import run_events

if TYPE_CHECKING:
    from ..runtime.pool import PoolStats

__all__ = [
    "EXTRA_HINT",
    "MetricsUnavailable",
    "OVERDUE_REFRESH",
    "install",
    "lock_attempted",
    "locks_attempted",
    "pool_sampled",
    "refresh_overdue",
    "serve",
    "worker_outcome",
]

logger = logging.getLogger(__name__)

EXTRA_HINT = 'pip install "django-scheduling[prometheus]"'
#: How often, in seconds, a scheduler's maintenance thread counts the overdue tasks again.
OVERDUE_REFRESH = 15.0

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class MetricsUnavailable(ImportError):
    """prometheus_client is not installed."""


class _Children:
    """The labelled children of one metric, looked up without taking the metric's lock.

    prometheus_client's ``labels()`` takes a lock of the whole metric on every call, and every
    firing calls it from its pool thread. Under a burst the pool threads queued on that one
    lock: with six schedulers in one process and 1,000 tasks each due every second, the pool
    threads spent most of their time waiting there. A dictionary read takes no lock; a miss
    asks ``labels()``, which gives two threads that miss at once the same child.
    """

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class _Metrics:
    """The metric objects, created once per process by ``install()``."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.runs = _Children(
            Counter(
                "django_scheduling_runs_total",
                "Finished runs of scheduled tasks.",
                ["task", "status"],
            )
        )
        self.duration = _Children(
            Histogram(
                "django_scheduling_run_duration_seconds",
                "How long runs of scheduled tasks took.",
                ["task"],
                buckets=DURATION_BUCKETS,
            )
        )
        self.lateness = _Children(
            Histogram(
                "django_scheduling_lateness_seconds",
                "How late runs started after their fire time.",
                ["task"],
                buckets=LATENESS_BUCKETS,
            )
        )
        self.skipped = _Children(
            Counter(
                "django_scheduling_skipped_total",
                "Firings not run here, by reason.",
                ["task", "reason"],
            )
        )
        self.lock_attempts = _Children(
            Counter(
                "django_scheduling_lock_attempts_total",
                "Attempts to take a task's lock, by outcome.",
                ["task", "acquired"],
            )
        )
        self.last_success = _Children(
            Gauge(
                "django_scheduling_last_success_timestamp_seconds",
                "When the last successful run of each task ended (seconds since the epoch); "
                "for an enqueued task, when its worker's success was reported.",
                ["task"],
                multiprocess_mode="max",
            )
        )
        self.last_enqueued = _Children(
            Gauge(
                "django_scheduling_last_enqueued_timestamp_seconds",
                "When a firing of each engine task was last enqueued (seconds since the epoch).",
                ["task"],
                multiprocess_mode="max",
            )
        )
        self.worker_outcomes = _Children(
            Counter(
                "django_scheduling_worker_outcomes_total",
                "Enqueued runs whose worker's outcome the engine reported, by outcome.",
                ["task", "outcome"],
            )
        )
        self.overdue = _overdue_gauge_class()(
            "django_scheduling_overdue_tasks",
            "Tasks whose next fire time is more than OVERDUE_AFTER in the past with no run.",
            multiprocess_mode="mostrecent",
        )
        self.queue_depth = Gauge(
            "django_scheduling_pool_queue_depth",
            "Firings waiting for a worker thread.",
            multiprocess_mode="livesum",
        )
        self.busy_threads = Gauge(
            "django_scheduling_pool_busy_threads",
            "Worker threads running a task.",
            multiprocess_mode="livesum",
        )
        self.threads = Gauge(
            "django_scheduling_pool_threads", "Worker threads alive.", multiprocess_mode="livesum"
        )
        self.outbox_pending = Gauge(
            "django_scheduling_outbox_pending",
            "Writes waiting for the database to answer again.",
            multiprocess_mode="livesum",
        )
        self.outbox_set_aside = Gauge(
            "django_scheduling_outbox_set_aside",
            "Writes that failed for good and were set aside since the scheduler started.",
            multiprocess_mode="livesum",
        )


def _overdue_gauge_class() -> Any:
    from prometheus_client import Gauge

    class OverdueGauge(Gauge):
        """A gauge that counts the overdue tasks again whenever it is collected."""

        def collect(self) -> Any:
            refresh_overdue()
            return super().collect()

    return OverdueGauge


_metrics: _Metrics | None = None
_install_lock = threading.Lock()
_last_overdue_refresh = 0.0


def available() -> bool:
    """Return whether prometheus_client can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def install() -> bool:
    """Create the metrics (once per process) and connect their receivers; return whether the
    metrics are on (prometheus_client is installed)."""
    global _metrics
    with _install_lock:
        if _metrics is None:
            if not available():
                return False
            _metrics = _Metrics()
    from .. import signals

    # Subscribing again is harmless, and restores observers that were removed.

    run_events.subscribe(signals.run_started, _started)
    run_events.subscribe(signals.run_succeeded, _succeeded)
    run_events.subscribe(signals.run_failed, _failed)
    run_events.subscribe(signals.run_skipped, _skipped)
    run_events.subscribe(signals.run_enqueued, _enqueued)
    return True


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` on *port* from a thread of this process.

    Raise ``MetricsUnavailable`` naming the extra to install when prometheus_client is missing.
    """
    if not install():
        raise MetricsUnavailable(
            f"--metrics-port needs prometheus_client; install it with {EXTRA_HINT}"
        )
    import os

    from prometheus_client import CollectorRegistry, start_http_server

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        start_http_server(port, addr, registry=registry)
    else:
        start_http_server(port, addr)


def _started(sender: str, *, scheduled_at: datetime | None, **kwargs: Any) -> None:
    if _metrics is not None and scheduled_at is not None:
        late = max((utcnow() - scheduled_at).total_seconds(), 0.0)
        _metrics.lateness.labels(sender).observe(late)


def _succeeded(sender: str, *, duration: timedelta, **kwargs: Any) -> None:
    if _metrics is not None:
        _metrics.runs.labels(sender, "succeeded").inc()
        _metrics.duration.labels(sender).observe(duration.total_seconds())
        _metrics.last_success.labels(sender).set(time.time())


def _failed(
    sender: str, *, duration: timedelta, exception: BaseException | None = None, **kwargs: Any
) -> None:
    if _metrics is not None:
        status = "timed_out" if isinstance(exception, RunTimedOut) else "failed"
        _metrics.runs.labels(sender, status).inc()
        _metrics.duration.labels(sender).observe(duration.total_seconds())


def _enqueued(sender: str, **kwargs: Any) -> None:
    # The scheduler's part of an engine task succeeded: its firing is on the queue. Whether
    # its worker succeeds is counted apart (worker_outcome).
    if _metrics is not None:
        _metrics.runs.labels(sender, "enqueued").inc()
        _metrics.last_enqueued.labels(sender).set(time.time())


def worker_outcome(task: str, outcome: str, succeeded: bool) -> None:
    """Count what the engine reported of an enqueued run of *task*: *outcome* is its state,
    lower case (``successful``, ``failed``, ``success``, ``failure``, ``revoked``)."""
    if _metrics is not None:
        _metrics.worker_outcomes.labels(task, outcome).inc()
        if succeeded:
            _metrics.last_success.labels(task).set(time.time())


def _skipped(sender: str, *, reason: str, **kwargs: Any) -> None:
    if _metrics is not None:
        _metrics.skipped.labels(sender, reason).inc()


def lock_attempted(name: str, acquired: bool) -> None:
    """Count one attempt to take the lock of task *name*."""
    if _metrics is not None:
        _metrics.lock_attempts.labels(name, "true" if acquired else "false").inc()


def locks_attempted(names: list[str], acquired: Any) -> None:
    """Count the attempts to take the locks of *names* at once; *acquired* holds the names
    taken."""
    if _metrics is not None:
        for name in names:
            lock_attempted(name, name in acquired)


def pool_sampled(stats: PoolStats) -> None:
    """Record a snapshot of this process's worker pool."""
    if _metrics is not None:
        _metrics.queue_depth.set(stats.queued)
        _metrics.busy_threads.set(stats.active)
        _metrics.threads.set(stats.threads)


def outbox_sampled(pending: int, set_aside: int) -> None:
    """Record this process's outbox: writes waiting, and writes set aside."""
    if _metrics is not None:
        _metrics.outbox_pending.set(pending)
        _metrics.outbox_set_aside.set(set_aside)


def refresh_overdue(*, every: float = 0.0) -> None:
    """Count the overdue tasks in the database into the gauge, unless the last count is less
    than *every* seconds old. A database error keeps the last value: a scrape never fails
    because of it."""
    global _last_overdue_refresh
    if _metrics is None:
        return
    monotonic = time.monotonic()
    if every and monotonic - _last_overdue_refresh < every:
        return
    _last_overdue_refresh = monotonic
    from django.db import connections

    from ..conf import get_settings
    from .monitoring import overdue_tasks

    try:
        conf = get_settings()
        connection = connections[conf.database]
        # Outside a request (the thread of start_http_server) nothing else closes it.
        opened_here = connection.connection is None
        try:
            count = overdue_tasks(
                now=utcnow(), overdue_after=conf.overdue_after, using=conf.database
            ).count()
        finally:
            if opened_here:
                connection.close()
    except Exception as exc:
        # Whatever fails (the database, the settings), a scrape must still answer.
        logger.warning("Could not count the overdue tasks for the metrics: %s", exc)
        return
    _metrics.overdue.set(count)
