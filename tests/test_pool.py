"""The worker pool (``runtime.pool``): ThreadPoolExecutor-style growth, rejection, shutdown.

Every wait is on an Event or a polled condition with a deadline; the one thing that must *not*
happen (a core thread exiting) is watched over a window computed from ``keep_alive``. Blocked work
is always released by the ``gate`` fixture, and every pool is shut down after its test.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from django_scheduling.runtime.pool import (
    PoolStats,
    RejectedWork,
    RejectionPolicy,
    Work,
    WorkerPool,
)

DEADLINE = 10.0  # seconds; only reached when a test is about to fail


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.001)


def holds_until(deadline: float, predicate: Callable[[], bool], what: str) -> None:
    """Fail as soon as *predicate* is false before the monotonic time *deadline*."""
    while True:
        assert predicate(), what
        if time.monotonic() >= deadline:
            return
        time.sleep(0.001)


class Gate:
    """Builds work items that record where they ran; blockers wait until ``open()``."""

    def __init__(self) -> None:
        self._release = threading.Event()
        self._lock = threading.Lock()
        self.started: dict[str, threading.Event] = {}
        self.ran: list[str] = []  # labels, in the order the items started
        self.thread_of: dict[str, threading.Thread] = {}

    def _record(self, label: str) -> None:
        with self._lock:
            self.ran.append(label)
            self.thread_of[label] = threading.current_thread()
        self.started.setdefault(label, threading.Event()).set()

    def blocker(self, label: str) -> Callable[[], None]:
        self.started[label] = threading.Event()

        def work() -> None:
            self._record(label)
            self._release.wait(DEADLINE)

        return work

    def quick(self, label: str) -> Callable[[], None]:
        return lambda: self._record(label)

    def wait_started(self, *labels: str) -> None:
        for label in labels:
            assert self.started.setdefault(label, threading.Event()).wait(DEADLINE), label

    def open(self) -> None:
        self._release.set()


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = Gate()
    try:
        yield gate
    finally:
        gate.open()


@pytest.fixture
def make_pool(gate: Gate) -> Iterator[Callable[..., WorkerPool]]:
    pools: list[WorkerPool] = []

    def make(**kwargs: Any) -> WorkerPool:
        options = {"core_size": 1, "max_size": 1, "queue_capacity": 0, "keep_alive": 60.0}
        pools.append(WorkerPool(**{**options, **kwargs}))
        return pools[-1]

    try:
        yield make
    finally:
        gate.open()
        for pool in pools:
            assert pool.shutdown(timeout=DEADLINE) == []


class Rejections:
    """An on_reject callback that records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Work, PoolStats, RejectionPolicy]] = []

    def __call__(self, work: Work, stats: PoolStats, policy: RejectionPolicy) -> None:
        self.calls.append((work, stats, policy))

    @property
    def labels(self) -> list[str]:
        return [work.label for work, _, _ in self.calls]


def counts(pool: WorkerPool) -> tuple[int, int, int]:
    stats = pool.stats()
    return stats.threads, stats.active, stats.queued


# Growth order


def test_growth_core_threads_then_queue_then_max_threads_then_rejection(make_pool, gate):
    pool = make_pool(core_size=2, max_size=4, queue_capacity=2)
    assert counts(pool) == (0, 0, 0)
    assert pool.submit(gate.blocker("core1"), label="core1")
    assert counts(pool) == (1, 1, 0)
    assert pool.submit(gate.blocker("core2"), label="core2")
    assert counts(pool) == (2, 2, 0)
    assert pool.submit(gate.blocker("queued1"), label="queued1")
    assert counts(pool) == (2, 2, 1)
    assert pool.submit(gate.blocker("queued2"), label="queued2")
    assert counts(pool) == (2, 2, 2)
    # The queue is full: a non-core thread runs the new item at once, ahead of the queue.
    assert pool.submit(gate.blocker("extra1"), label="extra1")
    assert counts(pool) == (3, 3, 2)
    assert pool.submit(gate.blocker("extra2"), label="extra2")
    assert counts(pool) == (4, 4, 2)
    gate.wait_started("core1", "core2", "extra1", "extra2")
    assert sorted(pool.running_labels) == ["core1", "core2", "extra1", "extra2"]
    assert "queued1" not in gate.ran
    with pytest.raises(RejectedWork):
        pool.submit(gate.quick("rejected"), label="rejected")
    stats = pool.stats()
    assert (stats.threads, stats.active, stats.queued, stats.rejected) == (4, 4, 2, 1)
    assert (stats.core_size, stats.max_size, stats.queue_capacity) == (2, 4, 2)

    gate.open()
    wait_until(lambda: pool.stats().completed == 6, "all six items completed")
    assert sorted(gate.ran[-2:]) == ["queued1", "queued2"]  # two threads take them
    assert "rejected" not in gate.ran
    assert pool.stats().threads == 4  # keep_alive is 60 s


def test_an_unbounded_queue_grows_to_max_size_then_queues_and_never_rejects(make_pool, gate):
    rejections = Rejections()
    pool = make_pool(core_size=1, max_size=3, queue_capacity=None, on_reject=rejections)
    # busy0 ends with the gate; busy1 and busy2 hold their threads until the end, so that one
    # thread takes the queue, and the order the items start in is the queue's order.
    held = Gate()
    try:
        assert pool.submit(gate.blocker("busy0"), label="busy0")
        for index in (1, 2):
            assert pool.submit(held.blocker(f"busy{index}"), label=f"busy{index}")
        # No thread was idle: each item started a thread, up to max_size.
        assert counts(pool) == (3, 3, 0)
        # Started, not only handed over: they run before the others.
        gate.wait_started("busy0")
        held.wait_started("busy1", "busy2")
        for index in range(500):  # far more than any bounded default: all wait, none dropped
            assert pool.submit(gate.quick(f"waiting{index}"), label=f"waiting{index}")
        stats = pool.stats()
        assert (stats.threads, stats.queued, stats.rejected, stats.queue_capacity) == (
            3,
            500,
            0,
            None,
        )
        assert str(stats) == "queue 500/unbounded, threads 3/3"
        gate.open()
        wait_until(lambda: pool.stats().completed == 501, "every waiting item ran")
        assert rejections.calls == []
        assert gate.ran[1:] == [f"waiting{index}" for index in range(500)]  # in order
    finally:
        held.open()


def test_an_unbounded_queue_uses_an_idle_thread_before_starting_one(make_pool, gate):
    pool = make_pool(core_size=1, max_size=3, queue_capacity=None)
    pool.submit(gate.quick("first"), label="first")
    wait_until(lambda: pool.stats().idle == 1, "the core thread waits for work")
    pool.submit(gate.quick("second"), label="second")
    wait_until(lambda: pool.stats().completed == 2, "both ran")
    assert pool.stats().threads == 1
    assert gate.thread_of["first"] is gate.thread_of["second"]


def test_new_core_thread_is_started_even_when_a_thread_is_idle(make_pool, gate):
    pool = make_pool(core_size=2, max_size=2, queue_capacity=10)
    pool.submit(gate.quick("first"), label="first")
    wait_until(lambda: pool.stats().idle == 1, "the first thread is idle")
    pool.submit(gate.quick("second"), label="second")
    assert pool.stats().threads == 2
    gate.wait_started("second")
    assert gate.thread_of["first"] is not gate.thread_of["second"]
    assert gate.thread_of["second"].name == "scheduling-worker-2"
    # Now at core size: the next item goes through the queue to an idle thread.
    wait_until(lambda: pool.stats().idle == 2, "both threads are idle")
    pool.submit(gate.quick("third"), label="third")
    gate.wait_started("third")
    assert pool.stats().threads == 2


def test_core_size_zero_starts_one_thread_for_the_queue(make_pool, gate):
    pool = make_pool(core_size=0, max_size=3, queue_capacity=5, keep_alive=0.05)
    pool.submit(gate.blocker("a"), label="a")
    pool.submit(gate.blocker("b"), label="b")
    gate.wait_started("a")
    assert counts(pool) == (1, 1, 1)  # like Java: one thread until the queue is full
    gate.open()
    wait_until(lambda: pool.stats().completed == 2, "both items completed")
    wait_until(lambda: pool.stats().threads == 0, "the idle thread timed out")
    assert pool.submit(gate.quick("c"), label="c")
    gate.wait_started("c")


def test_worker_threads_are_named_daemons(make_pool, gate):
    pool = make_pool(core_size=2, max_size=2, name="mypool")
    pool.submit(gate.quick("a"), label="a")
    pool.submit(gate.quick("b"), label="b")
    gate.wait_started("a", "b")
    threads = [gate.thread_of["a"], gate.thread_of["b"]]
    assert sorted(t.name for t in threads) == ["mypool-worker-1", "mypool-worker-2"]
    assert all(t.daemon for t in threads)


def test_label_defaults_to_the_callable_name(make_pool, gate):
    rejections = Rejections()
    pool = make_pool(rejection_policy="discard", on_reject=rejections)
    pool.submit(gate.blocker("busy"))
    gate.wait_started("busy")
    assert pool.running_labels == ["Gate.blocker.<locals>.work"]

    def refresh_cache() -> None: ...

    assert pool.submit(refresh_cache) is False
    assert rejections.labels == [refresh_cache.__qualname__]


# Rejection policies


def saturate(pool: WorkerPool, gate: Gate, queued: int = 0) -> None:
    """Fill *pool* (core 1, max 1) with a running blocker and *queued* queued blockers."""
    pool.submit(gate.blocker("running"), label="running")
    gate.wait_started("running")
    for n in range(1, queued + 1):
        assert pool.submit(gate.blocker(f"queued{n}"), label=f"queued{n}")


def test_abort_raises_and_calls_on_reject(make_pool, gate, caplog):
    rejections = Rejections()
    pool = make_pool(queue_capacity=1, on_reject=rejections)
    saturate(pool, gate, queued=1)
    with caplog.at_level(logging.WARNING, logger="django_scheduling.runtime.pool"):
        with pytest.raises(RejectedWork) as excinfo:
            pool.submit(gate.quick("nightly-report"), label="nightly-report")
    message = str(excinfo.value)
    assert "'nightly-report'" in message
    assert "queue 1/1, threads 1/1" in message
    assert "raise max_size or queue_capacity" in message
    assert excinfo.value.work.label == "nightly-report"
    [(work, stats, policy)] = rejections.calls
    assert work.label == "nightly-report"
    assert policy is RejectionPolicy.ABORT
    assert (stats.queued, stats.queue_capacity, stats.threads, stats.max_size) == (1, 1, 1, 1)
    assert stats.rejected == 1
    [record] = [r for r in caplog.records if r.name == "django_scheduling.runtime.pool"]
    assert record.levelno == logging.WARNING
    assert "'nightly-report'" in record.getMessage()
    assert "queue 1/1, threads 1/1" in record.getMessage()
    gate.open()
    wait_until(lambda: pool.stats().completed == 2, "the accepted items completed")
    assert "nightly-report" not in gate.ran


def test_caller_runs_contains_exceptions_from_the_item(make_pool, gate, caplog):
    pool = make_pool(rejection_policy=RejectionPolicy.CALLER_RUNS)
    saturate(pool, gate)
    with caplog.at_level(logging.ERROR, logger="django_scheduling.runtime.pool"):
        assert pool.submit(lambda: 1 / 0, label="divide") is True
    assert any("'divide'" in r.getMessage() and r.exc_info for r in caplog.records)


# For each setting: its member, what submit("new") returns (or raises) while the pool runs
# "running" with "queued1" and "queued2" in its queue, the item given to on_reject, and the items
# run, in the order they started.
REJECTIONS = {
    "abort": (RejectionPolicy.ABORT, RejectedWork, "new", ["running", "queued1", "queued2"]),
    "caller_runs": (
        RejectionPolicy.CALLER_RUNS,
        True,
        "new",
        ["running", "new", "queued1", "queued2"],
    ),
    "discard": (RejectionPolicy.DISCARD, False, "new", ["running", "queued1", "queued2"]),
    "discard_oldest": (
        RejectionPolicy.DISCARD_OLDEST,
        True,
        "queued1",
        ["running", "queued2", "new"],
    ),
}


@pytest.mark.parametrize("as_member", [False, True], ids=["string", "member"])
@pytest.mark.parametrize("setting", list(REJECTIONS))
def test_rejection_policy_given_as_string_or_member_acts_on_a_saturated_pool(
    make_pool, gate, setting, as_member
):
    member, outcome, victim, ran = REJECTIONS[setting]
    assert set(REJECTIONS) == {p.value for p in RejectionPolicy}
    rejections = Rejections()
    pool = make_pool(
        queue_capacity=2, rejection_policy=member if as_member else setting, on_reject=rejections
    )
    saturate(pool, gate, queued=2)
    at_rejection = replace(pool.stats(), rejected=1)
    assert (at_rejection.threads, at_rejection.active, at_rejection.queued) == (1, 1, 2)

    if outcome is RejectedWork:
        with pytest.raises(RejectedWork) as excinfo:
            pool.submit(gate.quick("new"), label="new")
        assert excinfo.value.work.label == "new"
        assert excinfo.value.stats == at_rejection
    else:
        assert pool.submit(gate.quick("new"), label="new") is outcome
    assert [(w.label, stats, policy) for w, stats, policy in rejections.calls] == [
        (victim, at_rejection, member)
    ]
    # Only caller_runs has run "new" by now: in this thread, before submit() returned.
    if member is RejectionPolicy.CALLER_RUNS:
        assert gate.ran == ["running", "new"]
        assert gate.thread_of["new"] is threading.current_thread()
    else:
        assert gate.ran == ["running"]
    assert pool.stats() == at_rejection  # discard_oldest queued "new" in the place it freed

    gate.open()
    wait_until(lambda: (s := pool.stats()).active == s.queued == 0, "the pool drained")
    assert gate.ran == ran
    assert pool.stats().completed == 3  # the worker ran three items in every case


def test_discard_oldest_without_a_queue_drops_the_new_item(make_pool, gate):
    rejections = Rejections()
    pool = make_pool(queue_capacity=0, rejection_policy="discard_oldest", on_reject=rejections)
    saturate(pool, gate)
    assert pool.submit(gate.quick("new"), label="new") is False
    assert rejections.labels == ["new"]


@pytest.mark.parametrize("setting", list(REJECTIONS))
def test_work_that_must_run_is_queued_past_the_capacity_and_never_discarded(
    make_pool, gate, setting
):
    # A firing claimed in the database must run: no policy may drop it, and discard_oldest
    # must pick its victim among the others.
    rejections = Rejections()
    pool = make_pool(queue_capacity=1, rejection_policy=setting, on_reject=rejections)
    saturate(pool, gate, queued=0)
    assert pool.submit(gate.quick("claimed"), label="claimed", must_run=True) is True
    assert pool.submit(gate.quick("claimed2"), label="claimed2", must_run=True) is True
    assert pool.stats().queued == 2  # past the capacity of 1
    if REJECTIONS[setting][0] is RejectionPolicy.ABORT:
        with pytest.raises(RejectedWork):
            pool.submit(gate.quick("new"), label="new")
    else:
        pool.submit(gate.quick("new"), label="new")
    assert rejections.labels == ["new"]  # the new one, never a claimed one
    gate.open()
    wait_until(lambda: (s := pool.stats()).active == s.queued == 0, "the pool drained")
    assert {"claimed", "claimed2"} <= set(gate.ran)


def test_a_failing_on_reject_does_not_change_the_outcome(make_pool, gate, caplog):
    def on_reject(work: Work, stats: PoolStats, policy: RejectionPolicy) -> None:
        raise LookupError("history table missing")

    pool = make_pool(rejection_policy="discard", on_reject=on_reject)
    saturate(pool, gate)
    with caplog.at_level(logging.ERROR, logger="django_scheduling.runtime.pool"):
        assert pool.submit(gate.quick("x"), label="x") is False
    assert any("on_reject" in r.getMessage() for r in caplog.records)


# Direct hand-off (queue_capacity=0)


def test_queue_capacity_zero_hands_off_only_to_idle_threads(make_pool, gate):
    pool = make_pool(core_size=1, max_size=2, queue_capacity=0)
    pool.submit(gate.blocker("a"), label="a")
    pool.submit(gate.blocker("b"), label="b")  # no idle thread: a second thread takes it
    assert counts(pool) == (2, 2, 0)
    with pytest.raises(RejectedWork, match="queue 0/0, threads 2/2"):
        pool.submit(gate.quick("c"), label="c")
    gate.open()
    wait_until(lambda: pool.stats().idle == 2, "both threads are idle")
    assert pool.submit(gate.quick("d"), label="d")  # handed to an idle thread
    gate.wait_started("d")
    assert pool.stats().threads == 2


# Keep-alive


def test_idle_threads_above_core_size_exit_after_keep_alive(make_pool, gate):
    keep_alive = 0.05
    pool = make_pool(core_size=1, max_size=3, queue_capacity=0, keep_alive=keep_alive)
    for label in ("a", "b", "c"):
        pool.submit(gate.blocker(label), label=label)
    assert pool.stats().threads == 3
    gate.wait_started("a", "b", "c")
    workers = [gate.thread_of[label] for label in ("a", "b", "c")]
    gate.open()

    def left_at_core_size() -> bool:
        stats = pool.stats()
        return (stats.threads, stats.idle, stats.completed) == (1, 1, 3)

    wait_until(
        lambda: (s := pool.stats()).threads <= 1 and s.completed == 3, "the extra threads exited"
    )
    assert left_at_core_size(), "the pool shrank to its core size and no further"
    # The remaining thread set its keep-alive deadline, if any, before it became idle: at most
    # keep_alive from now. It must not exit then, nor in the periods after.
    holds_until(
        time.monotonic() + 4 * keep_alive, left_at_core_size, "the core thread stayed, idle"
    )
    wait_until(lambda: sum(t.is_alive() for t in workers) == 1, "the extra threads ended")
    [core] = [t for t in workers if t.is_alive()]
    assert pool.submit(gate.quick("next"), label="next")
    gate.wait_started("next")
    assert gate.thread_of["next"] is core


# Failing work


def test_exception_in_work_is_logged_and_the_worker_keeps_going(make_pool, gate, caplog):
    pool = make_pool(queue_capacity=5)
    with caplog.at_level(logging.ERROR, logger="django_scheduling.runtime.pool"):
        pool.submit(lambda: {}["missing"], label="broken")
        pool.submit(gate.quick("after"), label="after")
        gate.wait_started("after")
        wait_until(lambda: pool.stats().completed == 2, "both items completed")
    assert gate.thread_of["after"].name == "scheduling-worker-1"
    assert pool.stats().threads == 1
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "'broken'" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is KeyError


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt])
def test_base_exception_ends_the_worker_loudly_and_it_is_replaced(
    make_pool, gate, caplog, exc_type
):
    def stop() -> None:
        raise exc_type()

    pool = make_pool(queue_capacity=5)
    with caplog.at_level(logging.ERROR, logger="django_scheduling.runtime.pool"):
        pool.submit(stop, label="stop")
        wait_until(lambda: pool.stats().completed == 1, "the item completed")
        pool.submit(gate.quick("after"), label="after")
        gate.wait_started("after")
    assert gate.thread_of["after"].name == "scheduling-worker-2"
    assert any(r.exc_info and r.exc_info[0] is exc_type for r in caplog.records)
    wait_until(lambda: pool.stats().completed == 2, "the replacement finished its item")
    assert pool.stats().threads == 1  # the ended worker left the pool
    assert pool.running_labels == []  # and took its item with it


# Shutdown


def test_shutdown_waits_for_running_and_queued_items(make_pool, gate):
    pool = make_pool(queue_capacity=2)
    saturate(pool, gate)
    pool.submit(gate.quick("q1"), label="q1")
    pool.submit(gate.quick("q2"), label="q2")
    result: list[list[str]] = []
    waiter = threading.Thread(target=lambda: result.append(pool.shutdown()))
    waiter.start()
    try:

        def refused() -> bool:
            try:
                pool.submit(gate.quick("late"), label="late")
            except RejectedWork:  # the pool is full but not shut down yet
                return False
            except RuntimeError:
                return True
            raise AssertionError("a full pool accepted more work")

        wait_until(refused, "shutdown() stopped accepting work")
        assert waiter.is_alive()  # "running" is still blocked
    finally:
        gate.open()
        waiter.join(DEADLINE)
    assert result == [[]]
    assert gate.ran == ["running", "q1", "q2"]
    assert pool.stats().threads == 0


def test_shutdown_with_timeout_returns_unfinished_labels(make_pool, gate, caplog):
    pool = make_pool(core_size=2, max_size=2, queue_capacity=2)
    pool.submit(gate.blocker("b1"), label="b1")
    pool.submit(gate.blocker("b2"), label="b2")
    pool.submit(gate.quick("q1"), label="q1")
    gate.wait_started("b1", "b2")
    with caplog.at_level(logging.WARNING, logger="django_scheduling.runtime.pool"):
        unfinished = pool.shutdown(timeout=0.05)
    assert unfinished == ["b1", "b2", "queued: q1"]
    assert "b1, b2, queued: q1" in caplog.text
    gate.open()
    wait_until(lambda: pool.stats().threads == 0, "the workers exited")
    assert "q1" not in gate.ran  # dropped at the deadline
    assert pool.stats().completed == 2


def test_shutdown_without_wait_returns_at_once_and_drains_in_the_background(make_pool, gate):
    pool = make_pool(queue_capacity=1)
    saturate(pool, gate)
    pool.submit(gate.quick("queued"), label="queued")
    assert pool.shutdown(wait=False) == []
    assert pool.running_labels == ["running"]
    gate.open()
    wait_until(lambda: pool.stats().threads == 0, "the workers exited")
    assert gate.ran == ["running", "queued"]


def test_shutdown_of_an_idle_pool_stops_its_threads(make_pool, gate):
    pool = make_pool(core_size=3, max_size=3)
    for label in ("a", "b", "c"):
        pool.submit(gate.quick(label), label=label)
    wait_until(lambda: pool.stats().idle == 3, "all threads are idle")
    assert pool.shutdown(timeout=DEADLINE) == []
    assert pool.stats().threads == 0


def test_submit_after_shutdown_raises(make_pool, gate):
    pool = make_pool(rejection_policy="discard")
    pool.shutdown()
    with pytest.raises(RuntimeError, match="is shut down"):
        pool.submit(gate.quick("late"), label="late")


def test_shutdown_with_wait_from_a_worker_raises(make_pool, gate):
    pool = make_pool()
    errors: list[BaseException] = []

    def shut_down_from_inside() -> None:
        try:
            pool.shutdown()
        except RuntimeError as exc:
            errors.append(exc)

    pool.submit(shut_down_from_inside, label="inside")
    wait_until(lambda: pool.stats().completed == 1, "the item completed")
    assert "use wait=False" in str(errors[0])


# Validation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"core_size": -1}, "core_size must be 0 or more, got -1"),
        ({"max_size": 0, "core_size": 0}, "max_size must be 1 or more, got 0"),
        ({"core_size": 5, "max_size": 2}, "max_size (2) is smaller than core_size (5)"),
        ({"queue_capacity": -1}, "queue_capacity must be 0 or more, got -1"),
        ({"keep_alive": -0.5}, "keep_alive must be 0 or more seconds, got -0.5"),
        ({"rejection_policy": "drop"}, "rejection_policy is 'drop'; use one of 'abort'"),
    ],
)
def test_invalid_settings_are_rejected(kwargs, message):
    options = {"core_size": 1, "max_size": 1, "queue_capacity": 0, "keep_alive": 1.0}
    with pytest.raises(ValueError) as excinfo:
        WorkerPool(**{**options, **kwargs})
    assert message in str(excinfo.value)
