"""A worker thread pool that grows and rejects like Java's ``ThreadPoolExecutor``.

On ``submit()`` the pool, in this order:

1. starts a new thread for the item while fewer than ``core_size`` threads exist, even if
   other threads are idle;
2. otherwise puts the item in a bounded FIFO queue of ``queue_capacity`` items (with a
   capacity of 0 the item is handed over only if an idle thread is waiting for work);
3. otherwise starts a new thread for the item while fewer than ``max_size`` threads exist;
4. otherwise rejects the item according to the ``RejectionPolicy``.

With ``queue_capacity=None`` the queue is unbounded and nothing is ever rejected: an item that
finds no idle thread starts a new one while fewer than ``max_size`` exist (as Python's
``ThreadPoolExecutor`` does), and waits in the queue otherwise.

Threads above ``core_size`` that stay idle for ``keep_alive`` seconds exit.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PoolStats", "RejectedWork", "RejectionPolicy", "Work", "WorkerPool"]

logger = logging.getLogger(__name__)


class RejectionPolicy(enum.StrEnum):
    """What ``WorkerPool.submit()`` does with an item when the queue and the threads are full."""

    ABORT = "abort"  # raise RejectedWork
    CALLER_RUNS = "caller_runs"  # run the item in the submitting thread
    DISCARD = "discard"  # drop the item
    DISCARD_OLDEST = "discard_oldest"  # drop the oldest queued item and queue this one


@dataclass(frozen=True, slots=True)
class Work:
    """A callable submitted to the pool, with the label used in logs and reports."""

    fn: Callable[[], object]
    label: str
    #: Never passed to the rejection policy: queued past the capacity if need be.
    must_run: bool = False


@dataclass(frozen=True)
class PoolStats:
    """A consistent snapshot of a pool's counters."""

    threads: int  # worker threads alive
    idle: int  # threads waiting for work
    active: int  # threads running an item
    queued: int
    queue_capacity: int | None  # None: unbounded
    core_size: int
    max_size: int
    completed: int  # items finished by worker threads, successfully or not
    rejected: int  # items passed to the rejection policy (and to on_reject)
    #: Items a submitter has kept room for and not submitted yet (see ``room()``).
    reserved: int = 0

    def __str__(self) -> str:
        capacity = "unbounded" if self.queue_capacity is None else self.queue_capacity
        text = f"queue {self.queued}/{capacity}, threads {self.threads}/{self.max_size}"
        if self.reserved:
            text += f", {self.reserved} more admitted"
        return text


class RejectedWork(RuntimeError):
    """Raised by ``submit()`` under the ABORT policy when the pool is saturated."""

    def __init__(self, work: Work, stats: PoolStats) -> None:
        super().__init__(
            f"Work {work.label!r} was rejected: {stats}; raise max_size or queue_capacity, "
            "or choose another rejection policy"
        )
        self.work = work
        self.stats = stats


RejectHandler = Callable[[Work, PoolStats, RejectionPolicy], None]


class WorkerPool:
    """Run submitted callables on a bounded, self-sizing set of daemon threads."""

    def __init__(
        self,
        *,
        core_size: int,
        max_size: int,
        queue_capacity: int | None,
        keep_alive: float,
        rejection_policy: RejectionPolicy | str = RejectionPolicy.ABORT,
        name: str = "scheduling",
        on_reject: RejectHandler | None = None,
        on_exit: Callable[[], object] | None = None,
    ) -> None:
        if core_size < 0:
            raise ValueError(
                f"core_size must be 0 or more, got {core_size}; use 0 for no permanent threads"
            )
        if max_size < 1:
            raise ValueError(f"max_size must be 1 or more, got {max_size}; a pool needs a thread")
        if max_size < core_size:
            raise ValueError(
                f"max_size ({max_size}) is smaller than core_size ({core_size}); "
                "raise max_size or lower core_size"
            )
        if queue_capacity is not None and queue_capacity < 0:
            raise ValueError(
                f"queue_capacity must be 0 or more, got {queue_capacity}; "
                "use 0 to hand items directly to idle threads, None for no bound"
            )
        if keep_alive < 0:
            raise ValueError(
                f"keep_alive must be 0 or more seconds, got {keep_alive}; "
                "use 0 to stop idle extra threads at once"
            )
        try:
            self.rejection_policy = RejectionPolicy(rejection_policy)
        except ValueError:
            choices = ", ".join(repr(p.value) for p in RejectionPolicy)
            raise ValueError(
                f"rejection_policy is {rejection_policy!r}; use one of {choices}"
            ) from None
        self.core_size, self.max_size = core_size, max_size
        self.queue_capacity, self.keep_alive = queue_capacity, keep_alive
        self.name, self.on_reject = name, on_reject
        #: Called by each worker thread as it exits (the scheduler closes the thread's
        #: database connections there).
        self.on_exit = on_exit
        lock = threading.Lock()
        self._work_available = threading.Condition(lock)  # idle workers wait here
        self._terminated = threading.Condition(lock)  # shutdown() waits here for workers to exit
        self._queue: deque[Work] = deque()
        self._workers: set[threading.Thread] = set()
        self._running: dict[threading.Thread, Work] = {}
        self._idle = self._completed = self._rejected = self._started = 0
        self._shut_down = False

    def submit(
        self, work: Callable[[], object], *, label: str = "", must_run: bool = False
    ) -> bool:
        """
        Run *work* on the pool; return True if it was accepted (or run by the caller) and
        False if it was discarded. Raise ``RejectedWork`` under the ABORT policy and
        ``RuntimeError`` after ``shutdown()``.

        Work submitted with *must_run* is never rejected, nor discarded as the oldest: when
        the pool is saturated it waits in the queue, past its capacity.
        """
        item = Work(work, label or getattr(work, "__qualname__", None) or repr(work), must_run)
        policy = self.rejection_policy
        with self._work_available:
            if self._shut_down:
                raise RuntimeError(f"pool {self.name!r} is shut down; cannot run {item.label!r}")
            if len(self._workers) < self.core_size:
                self._start_worker(item)
                return True
            if self.queue_capacity is None:  # unbounded: grow while no thread is idle, then queue
                if not self._idle and len(self._workers) < self.max_size:
                    self._start_worker(item)
                else:
                    self._queue.append(item)
                    if self._idle:
                        self._work_available.notify()
                return True
            if self._offer(item):
                if not self._workers:  # core_size 0: someone has to drain the queue
                    self._start_worker(None)
                return True
            if len(self._workers) < self.max_size:
                self._start_worker(item)
                return True
            if must_run:
                self._queue.append(item)
                return True
            victim = item
            if policy is RejectionPolicy.DISCARD_OLDEST and self.queue_capacity:
                oldest = next((queued for queued in self._queue if not queued.must_run), None)
                if oldest is not None:
                    self._queue.remove(oldest)
                    self._queue.append(item)
                    victim = oldest
            self._rejected += 1
            stats = self._snapshot()
        self._reject(victim, stats, policy)
        if policy is RejectionPolicy.ABORT:
            raise RejectedWork(item, stats)
        if policy is RejectionPolicy.CALLER_RUNS and not self._shut_down:
            self._execute(item)
            return True
        return victim is not item

    def shutdown(self, *, wait: bool = True, timeout: float | None = None) -> list[str]:
        """
        Stop accepting work and let running and queued items finish.

        With ``wait=False`` return ``[]`` at once; the items still finish in the background.
        Otherwise wait up to *timeout* seconds (forever if None). If the pool hasn't drained by
        then, drop the items still queued and return the labels of the unfinished items: those
        still running as they are, then the dropped ones prefixed with ``"queued: "``.
        """
        with self._terminated:
            if wait and threading.current_thread() in self._workers:
                raise RuntimeError("work can't wait for its own pool to shut down; use wait=False")
            self._shut_down = True
            self._work_available.notify_all()
            if not wait:
                return []
            if self._terminated.wait_for(lambda: not self._workers, timeout):
                return []
            unfinished = [w.label for w in self._running.values()]
            unfinished += [f"queued: {w.label}" for w in self._queue]
            self._queue.clear()
        if unfinished:
            logger.warning(
                "Pool %r did not finish within %ss: %s", self.name, timeout, ", ".join(unfinished)
            )
        return unfinished

    def stats(self) -> PoolStats:
        """Return a consistent snapshot of the pool's counters."""
        with self._work_available:
            return self._snapshot()

    def room(self) -> int | None:
        """Return how many items ``submit()`` would take now without passing one to the
        rejection policy; ``None`` for an unbounded queue."""
        if self.queue_capacity is None:
            return None
        with self._work_available:
            threads = max(self.max_size - len(self._workers), 0)
            if self.queue_capacity:
                return threads + max(self.queue_capacity - len(self._queue), 0)
            # A direct hand-off: each item needs an idle thread, or a new one.
            return threads + max(self._idle - len(self._queue), 0)

    def count_rejection(self) -> None:
        """Count an item that was refused before it was submitted (see ``room()``)."""
        with self._work_available:
            self._rejected += 1

    @property
    def running_labels(self) -> list[str]:
        """The labels of the items being run by worker threads, oldest first."""
        with self._work_available:
            return [w.label for w in self._running.values()]

    # The methods below, except _work_loop, _execute and _reject, are called with the lock held.

    def _snapshot(self) -> PoolStats:
        return PoolStats(
            threads=len(self._workers),
            idle=self._idle,
            active=len(self._running),
            queued=len(self._queue),
            queue_capacity=self.queue_capacity,
            core_size=self.core_size,
            max_size=self.max_size,
            completed=self._completed,
            rejected=self._rejected,
        )

    def _offer(self, item: Work) -> bool:
        # A queue of capacity 0 is a direct hand-off: each queued item needs its own idle taker.
        room = self.queue_capacity if self.queue_capacity else self._idle
        if len(self._queue) >= room:
            return False
        self._queue.append(item)
        if self._idle:  # busy threads look at the queue before they wait: no need to wake one
            self._work_available.notify()
        return True

    def _start_worker(self, first: Work | None) -> None:
        self._started += 1
        # The first item goes in a box the thread empties: the thread's arguments would keep
        # it for the thread's life.
        thread = threading.Thread(
            target=self._work_loop, args=([first],), name=f"{self.name}-worker-{self._started}"
        )
        thread.daemon = True
        self._workers.add(thread)
        if first is not None:
            self._running[thread] = first
        try:
            thread.start()
        except BaseException:
            self._workers.discard(thread)
            self._running.pop(thread, None)
            raise

    def _take(self, me: threading.Thread) -> Work | None:
        """Wait for the next item; return None, unregistering *me*, when the thread should exit."""
        deadline: float | None = None
        while not self._queue:
            timeout: float | None = None
            if self._shut_down:
                self._retire(me)
                return None
            if len(self._workers) > self.core_size:  # not needed as a core thread: may time out
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.keep_alive
                if now >= deadline:
                    self._retire(me)
                    return None
                timeout = deadline - now
            else:
                deadline = None
            self._idle += 1
            try:
                self._work_available.wait(timeout)
            finally:
                self._idle -= 1
        self._running[me] = item = self._queue.popleft()
        return item

    def _retire(self, me: threading.Thread) -> None:
        self._workers.discard(me)
        self._terminated.notify_all()

    def _work_loop(self, box: list[Work | None]) -> None:
        me = threading.current_thread()
        item = box.pop()
        try:
            if item is None:
                with self._work_available:
                    item = self._take(me)
            while item is not None:
                try:
                    self._execute(item)
                except BaseException:
                    with self._work_available:
                        del self._running[me]
                        self._completed += 1
                    raise
                # Account for this item and take the next one in a single hold of the lock.
                with self._work_available:
                    del self._running[me]
                    self._completed += 1
                    item = None  # not kept while the thread waits for the next one
                    item = self._take(me)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: end this thread loudly
            logger.exception("Worker %s of pool %r stopped by %r", me.name, self.name, exc)
            with self._work_available:
                self._retire(me)
                if not self._shut_down or self._queue:
                    self._start_worker(None)  # replace it, as ThreadPoolExecutor does
        finally:
            if self.on_exit is not None:
                try:
                    self.on_exit()
                except Exception:
                    logger.exception("Worker %s of pool %r could not clean up", me.name, self.name)

    def _execute(self, item: Work) -> None:
        try:
            item.fn()
        except Exception:
            logger.exception("Work %r raised an exception", item.label)

    def _reject(self, victim: Work, stats: PoolStats, policy: RejectionPolicy) -> None:
        logger.warning(
            "Pool %r rejected work %r (policy %s): %s", self.name, victim.label, policy.value, stats
        )
        if self.on_reject is not None:
            try:
                self.on_reject(victim, stats, policy)
            except Exception:
                logger.exception("on_reject failed for work %r", victim.label)
