"""The delay queue, the dispatcher thread and the worker pool: the only module that sleeps or
starts threads.

One dispatcher thread keeps every task in a heap ordered by its next fire time. It sleeps until
the earliest one is due (or until something earlier is added), pops every due entry in one hold
of the lock and hands each to the worker pool. A task goes back into the heap only when its run
has ended, so one task never runs twice at once in this process. What a firing does (locking,
history) is the runner's business: see ``execution.TaskRunner``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from .clock import utcnow
from .pool import PoolStats, RejectedWork, RejectionPolicy, Work, WorkerPool

__all__ = ["Scheduler", "Entry", "Runner", "Timer", "shutdown_requested"]

logger = logging.getLogger(__name__)

_local = threading.local()


def shutdown_requested() -> bool:
    """Return whether the scheduler running the current task is shutting down."""
    scheduler: Scheduler | None = getattr(_local, "scheduler", None)
    return scheduler is not None and scheduler.stopping


@dataclass(eq=False, slots=True)
class Entry:
    """A task in the delay queue, with what the dispatcher needs to know of it."""

    name: str
    payload: Any = None
    running: bool = False
    manual_pending: bool = False
    next_fire_time: datetime | None = None
    generation: int = 0
    removed: bool = False


@dataclass(slots=True)  # not frozen: a frozen dataclass is 3x slower to create
class Firing:
    """One firing handed to the pool: *entry* due at *fire_time* (``None`` for a manual run)."""

    scheduler: Scheduler
    entry: Entry
    fire_time: datetime | None

    def __call__(self) -> None:
        self.scheduler._run_firing(self)


class Runner(Protocol):
    """What the scheduler asks of the code that runs firings."""

    def first_fire_time(self, entry: Entry, *, now: datetime) -> datetime | None: ...

    def run(self, entry: Entry, fire_time: datetime | None) -> datetime | None:
        """Run one firing and return the entry's next fire time (``None``: never again)."""

    def rejected(self, entry: Entry, fire_time: datetime | None, stats: PoolStats) -> None: ...

    def next_after_rejection(self, entry: Entry, fire_time: datetime | None) -> datetime | None: ...


class Timer:
    """A thread that calls functions at given monotonic times (lock keep-alive uses it)."""

    def __init__(self, name: str = "scheduling-timer") -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cond = threading.Condition()
        self._counter = itertools.count()
        self._cancelled: set[int] = set()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        """Start calling; calls registered before are kept."""
        self._thread.start()

    def call_at(self, when: float, fn: Callable[[], None]) -> int:
        """Call *fn* at monotonic time *when*; return a handle for ``cancel()``."""
        with self._cond:
            handle = next(self._counter)
            heapq.heappush(self._heap, (when, handle, fn))
            self._cond.notify()
            return handle

    def cancel(self, handle: int) -> None:
        with self._cond:
            self._cancelled.add(handle)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        break
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                if self._stopped:
                    return
                _, handle, fn = heapq.heappop(self._heap)
                if handle in self._cancelled:
                    self._cancelled.discard(handle)
                    continue
            try:
                fn()
            except Exception:
                logger.exception("A timer callback failed")


@dataclass
class _State:
    heap: list[tuple[float, int, int, Entry, datetime | None]] = field(default_factory=list)
    entries: dict[str, Entry] = field(default_factory=dict)


class Scheduler:
    """Fire entries on time through a worker pool, as a runner decides."""

    #: The dispatcher wakes at least this often, so a wall-clock jump is noticed.
    MAX_SLEEP = 30.0

    def __init__(
        self,
        runner: Runner,
        *,
        core_pool_size: int = 4,
        max_pool_size: int = 16,
        queue_capacity: int = 100,
        keep_alive: float = 60.0,
        rejection_policy: RejectionPolicy | str = RejectionPolicy.ABORT,
        clock: Callable[[], datetime] = utcnow,
        name: str = "scheduling",
    ) -> None:
        self.runner = runner
        self.clock = clock
        self.name = name
        self.pool = WorkerPool(
            core_size=core_pool_size,
            max_size=max_pool_size,
            queue_capacity=queue_capacity,
            keep_alive=keep_alive,
            rejection_policy=rejection_policy,
            name=name,
            on_reject=self._on_reject,
        )
        #: Calls functions at given times (lock keep-alive, polling); runs from start().
        self.timer = Timer(f"{name}-timer")
        self.stopping = False
        self._state = _State()
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._dispatcher: threading.Thread | None = None
        self._idle = threading.Condition(self._cond)
        self._idle_waiters = 0  # threads in wait_until_idle(): _finish() wakes them only then

    # -- public API ----------------------------------------------------------------------------

    def add(self, entry: Entry) -> datetime | None:
        """Add *entry* and schedule its first firing; return that fire time."""
        fire_time = self.runner.first_fire_time(entry, now=self.clock())
        with self._cond:
            self._state.entries[entry.name] = entry
            self._push(entry, fire_time)
        return fire_time

    def entries(self) -> list[Entry]:
        with self._cond:
            return list(self._state.entries.values())

    def run_now(self, name: str) -> bool:
        """Queue a manual run of *name* as soon as it is not running; False if unknown."""
        with self._cond:
            entry = self._state.entries.get(name)
            if entry is None or entry.removed:
                return False
            if entry.running:
                entry.manual_pending = True
            else:
                self._push_item(entry, self.clock(), manual=True)
            return True

    def start(self) -> None:
        """Start the dispatcher thread."""
        if self._dispatcher is not None:
            raise RuntimeError("the scheduler has already been started")
        self.timer.start()
        self._dispatcher = threading.Thread(
            target=self._dispatch_loop, name=f"{self.name}-dispatcher", daemon=True
        )
        self._dispatcher.start()

    def shutdown(self, timeout: float | None = None) -> list[str]:
        """Stop dispatching, wait up to *timeout* seconds for running tasks, and return the
        names of those still running then."""
        with self._cond:
            self.stopping = True
            self._cond.notify_all()
        if self._dispatcher is not None and self._dispatcher is not threading.current_thread():
            self._dispatcher.join()
        still_running = self.pool.shutdown(wait=True, timeout=timeout)
        self.timer.stop()
        return still_running

    def wait_until_idle(self, timeout: float) -> bool:
        """Wait until no firing is running; for tests and benchmarks."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(e.running for e in self._state.entries.values()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle_waiters += 1
                try:
                    self._idle.wait(remaining)
                finally:
                    self._idle_waiters -= 1
        return True

    # -- the delay queue -----------------------------------------------------------------------

    def _push(self, entry: Entry, fire_time: datetime | None) -> None:
        entry.next_fire_time = fire_time
        entry.generation += 1
        if fire_time is not None and not entry.removed:
            self._push_item(entry, fire_time, manual=False)

    def _push_item(self, entry: Entry, fire_time: datetime, *, manual: bool) -> None:
        when = fire_time.timestamp()
        was_first = not self._state.heap or when < self._state.heap[0][0]
        generation = -1 if manual else entry.generation
        heapq.heappush(
            self._state.heap,
            (when, next(self._seq), generation, entry, None if manual else fire_time),
        )
        if was_first:
            self._cond.notify()

    def _dispatch_loop(self) -> None:
        while True:
            due = self._take_due()
            if due is None:
                return
            for firing in due:
                self._submit(firing)

    def _take_due(self) -> list[Firing] | None:
        """Wait until entries are due and return them; None once the scheduler stops."""
        with self._cond:
            while not self.stopping:
                heap = self._state.heap
                now = time.time()
                due: list[Firing] = []
                while heap and heap[0][0] <= now:
                    _, _, generation, entry, fire_time = heapq.heappop(heap)
                    if generation == -1:  # a manual run
                        if entry.running:
                            entry.manual_pending = True
                            continue
                    elif generation != entry.generation or entry.running:
                        continue  # superseded by a later push
                    entry.running = True
                    due.append(Firing(self, entry, fire_time))
                if due:
                    return due
                timeout = min(heap[0][0] - now, self.MAX_SLEEP) if heap else self.MAX_SLEEP
                self._cond.wait(timeout)
            return None

    def _submit(self, firing: Firing) -> None:
        try:
            self.pool.submit(firing, label=firing.entry.name)
        except RejectedWork:
            pass  # _on_reject has recorded it and rescheduled the entry
        except RuntimeError:
            # The pool is shutting down: the firing will not run.
            self._finish(firing.entry, None, reschedule=False)

    def _on_reject(self, work: Work, stats: PoolStats, policy: RejectionPolicy) -> None:
        firing = work.fn
        if not isinstance(firing, Firing):
            return
        if policy is RejectionPolicy.CALLER_RUNS and not self.stopping:
            return  # the pool runs it in the dispatcher thread
        entry = firing.entry
        try:
            self.runner.rejected(entry, firing.fire_time, stats)
            next_time = self.runner.next_after_rejection(entry, firing.fire_time)
        except Exception:
            logger.exception("Recording the rejection of %s failed", entry.name)
            next_time = None
        self._finish(entry, next_time, reschedule=True)

    # -- running one firing (in a worker thread) -----------------------------------------------

    def _run_firing(self, firing: Firing) -> None:
        entry = firing.entry
        _local.scheduler = self
        next_time: datetime | None = None
        try:
            next_time = self.runner.run(entry, firing.fire_time)
        except Exception:
            logger.exception("Running %s failed outside the task itself", entry.name)
            next_time = self._retry_time(entry)
        finally:
            _local.scheduler = None
            self._finish(entry, next_time, reschedule=True)

    def _retry_time(self, entry: Entry) -> datetime | None:
        """After an infrastructure error, try again from the trigger's view of now."""
        try:
            return self.runner.first_fire_time(entry, now=self.clock())
        except Exception:
            logger.exception("Rescheduling %s failed; it stops", entry.name)
            return None

    def _finish(self, entry: Entry, next_time: datetime | None, *, reschedule: bool) -> None:
        with self._cond:
            entry.running = False
            if reschedule:
                self._push(entry, next_time)
            if entry.manual_pending and not entry.removed:
                entry.manual_pending = False
                self._push_item(entry, self.clock(), manual=True)
            if self._idle_waiters:
                self._idle.notify_all()
