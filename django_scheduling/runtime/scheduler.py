"""The delay queue, the dispatcher thread and the worker pool.

One dispatcher thread keeps every task in a heap of times, each with the list of the tasks whose
next fire time it is. It sleeps until the earliest one is due (or until something earlier is
added), pops every due entry in one hold of the lock, and hands them, in batches of
``BATCH_SIZE``, to the claim threads (``claim_queue``), the batch with the earliest fire time
first. There the firing pipeline (``firing.FiringPipeline``) decides and claims each batch,
and answers for each firing with a ``Call`` to run on the worker pool or with when its entry
fires next. A call reports its entry's next fire time once its end is recorded; only then does
the entry go back into the delay queue, so one task never runs twice at once in this process.
The dispatcher does no I/O.

With a bounded queue (``QUEUE_CAPACITY``), a firing is claimed only if the pool has room for
it: those that find none get the rejection policy before they are claimed, so that another
instance may still run them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from ..bursts import Burst, bursts
from ..clock import utcnow
from ..context import shutdown_requested, stopping_context
from .calls import Call, Dispatcher, Done, Entry, Outcome, RunRequest
from .claim_queue import CLAIM_THREADS, ClaimQueue
from .delay_queue import BATCH_SIZE, CLAIM_AHEAD_MAX, DelayQueue, Due, claim_ahead
from .pool import PoolStats, RejectedWork, RejectionPolicy, Work, WorkerPool

__all__ = [
    "BATCH_SIZE",
    "CLAIM_AHEAD_MAX",
    "Entry",
    "RunRequest",
    "Scheduler",
    "claim_ahead",
    "shutdown_requested",
]

logger = logging.getLogger(__name__)

#: After a dispatch error, an entry is tried again this long later, doubling up to a minute.
_RETRY_MIN, _RETRY_MAX = 1.0, 60.0


class _Calls:
    """Claimed firings whose time has come, run in order by the pool workers that drain
    them: a burst hands thousands over at once, and not one pool item each. While they are
    being taken up, the threads that wait on ``bursts`` hold back (see ``bursts``).

    Workers join as they are needed: one starts, and a worker that takes a call while others
    wait asks the pool for one more, unless the last one asked for has not started yet. Slow
    runs so get as many workers as the pool has, one after the other; quick ones the few that
    keep up. Waking every worker at once for each batch made each of them wait for the GIL
    to take a call or two (at 10,000 tasks due every second on three instances, the pool's
    wake-ups were 5.6 % of a scheduler's samples)."""

    __slots__ = ("_asked", "_mutex", "_starting", "burst", "calls", "scheduler")

    def __init__(self, scheduler: Scheduler, calls: list[Call], burst: Burst | None) -> None:
        self.scheduler = scheduler
        calls.reverse()  # taken from the end: the first one first
        self.calls = calls
        self.burst = burst
        self._mutex = threading.Lock()
        self._asked = 1  # workers asked for, the first one by the scheduler
        self._starting = True  # one was asked for and has not started yet

    def __call__(self) -> None:
        calls, run, burst = self.calls, self.scheduler._run_call, self.burst
        with self._mutex:
            self._starting = False
        with stopping_context(self.scheduler._is_stopping):
            while True:
                try:
                    call = calls.pop()  # atomic: each call is taken by one worker
                except IndexError:
                    return
                if calls:
                    self._ask_for_another()
                elif burst is not None:
                    burst.started()  # the last one taken up (two workers may both say so)
                run(call)

    def _ask_for_another(self) -> None:
        """Have one more worker take calls, unless one asked for has not started yet or the
        pool has no more."""
        with self._mutex:
            if self._starting or self._asked >= self.scheduler.pool.max_size:
                return
            self._starting = True
            self._asked += 1
        try:
            self.scheduler.pool.submit(self, label="claimed firings", must_run=True)
        except RuntimeError:
            pass  # the pool is shutting down: the workers already here take the calls


class _OneCall:
    """A claimed firing handed to a bounded pool on its own: it takes a place in the queue,
    and ``discard_oldest`` may drop it there (``Call.reject``)."""

    __slots__ = ("call", "scheduler")

    def __init__(self, scheduler: Scheduler, call: Call) -> None:
        self.scheduler, self.call = scheduler, call

    def __call__(self) -> None:
        with stopping_context(self.scheduler._is_stopping):
            self.scheduler._run_call(self.call)


class _Room:
    """With a bounded queue: the room kept in the pool for the firings admitted and not handed
    to it yet, so that those admitted after them do not count on it too."""

    __slots__ = ("_lock", "kept", "pool")

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self._lock = threading.Lock()
        self.kept = 0

    def admit(self, due: list[Due]) -> tuple[list[Due], list[Due]]:
        """Split *due* into the firings the pool has room for, which keep it, and the others."""
        room = self.pool.room()
        if (
            self.pool.rejection_policy is RejectionPolicy.DISCARD_OLDEST
            and self.pool.queue_capacity
        ):
            room = None  # the pool drops the oldest waiting call for each
        with self._lock:  # the room seen and the room kept, in one step
            free = len(due) if room is None else max(room - self.kept, 0)
            admitted, refused = due[:free], due[free:]
            self.kept += len(admitted)
        return admitted, refused

    def keep(self, count: int) -> None:
        with self._lock:
            self.kept += count

    def release(self, count: int) -> None:
        with self._lock:
            self.kept = max(self.kept - count, 0)


class Scheduler:
    """Fire entries on time through a worker pool, as a dispatcher (the firing pipeline)
    decides."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        core_pool_size: int = 4,
        max_pool_size: int = 16,
        queue_capacity: int | None = None,
        keep_alive: float = 60.0,
        rejection_policy: RejectionPolicy | str = RejectionPolicy.ABORT,
        clock: Callable[[], datetime] = utcnow,
        name: str = "scheduling",
        on_thread_exit: Callable[[], object] | None = None,
        claim_threads: int = CLAIM_THREADS,
    ) -> None:
        self.dispatcher = dispatcher
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
            on_exit=on_thread_exit,
        )
        self.claims = ClaimQueue(
            self._claim,
            keep_alive=keep_alive,
            name=f"{name}-claims",
            on_exit=on_thread_exit,
            threads=claim_threads,
        )
        self._room = _Room(self.pool)
        #: Every call's ``done``, bound once (see ``calls.Done``).
        self._done: Done = self._call_done
        self.queue = DelayQueue()
        self._cond = self.queue.cond
        #: The entries put in the place of one whose run was under way, by name, with the
        #: entry whose run they wait for: each is scheduled when that run ends.
        self._successors: dict[str, tuple[Entry, Entry]] = {}
        #: The entries removed while they ran, by name, until their run ends.
        self._draining: dict[str, Entry] = {}
        self._dispatcher: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        """Whether the scheduler is stopping (it dispatches no more)."""
        return self.queue.stopping

    @property
    def bounded(self) -> bool:
        """Whether the pool's queue has a capacity, and so rejects what does not fit."""
        return self.pool.queue_capacity is not None

    # -- public API ----------------------------------------------------------------------------

    def add(self, entry: Entry) -> datetime | None:
        """Add *entry* and schedule its first firing; return that fire time."""
        fire_time = self.dispatcher.first_fire_time(entry, now=self.clock())
        with self._cond:
            self.queue.state.entries[entry.name] = entry
            self.queue.push(entry, fire_time)
        return fire_time

    def replace(self, entry: Entry) -> None:
        """Put *entry* in the place of the entry of its name, or add it. The old entry fires no
        more; a run of an entry of that name under way (the old one's, or that of one removed
        since) ends first, and *entry* is scheduled then, with the run requests that came
        meanwhile: a task never runs twice at once in this process."""
        name = entry.name
        with self._cond:
            old = self.queue.state.entries.get(name)
            self.queue.state.entries[name] = entry
            if old is not None:
                old.next_fire_time = None  # skipped where the heap still lists it
            waiting = self._successors.get(name)
            awaited: Entry | None
            if waiting is not None:
                # *old* waited for a run that goes on: *entry* waits for it in its place.
                awaited = waiting[0]
            elif old is not None and old.running:
                awaited = old
            else:
                awaited = self._draining.get(name)
            if awaited is not None:
                entry.running = True  # until the awaited run ends: see _replaced
                if old is not None and old.pending_request is not None:
                    entry.pending_request = entry.pending_request or old.pending_request
                self._successors[name] = (awaited, entry)
                return
            self.queue.push(entry, self.dispatcher.first_fire_time(entry, now=self.clock()))

    def remove(self, name: str) -> bool:
        """Stop firing the entry *name*; a run of it under way ends as usual, and an entry of
        that name added meanwhile waits for it. Return False if the name is unknown."""
        with self._cond:
            entry = self.queue.state.entries.pop(name, None)
            waiting = self._successors.pop(name, None)
            if entry is None:
                return False
            entry.next_fire_time = None
            if waiting is not None:
                self._draining[name] = waiting[0]  # the run *entry* waited for goes on
            elif entry.running:
                self._draining[name] = entry
            return True

    def entries(self) -> list[Entry]:
        with self._cond:
            return list(self.queue.state.entries.values())

    def entry(self, name: str) -> Entry | None:
        """Return the entry named *name*, if this scheduler has it."""
        return self.queue.state.entries.get(name)  # one dict read: atomic, no lock needed

    def run_now(self, name: str, request: RunRequest | None = None) -> bool:
        """Queue a run of *name* outside its schedule, as soon as it is not running.

        Return False if the name is unknown. A request for an entry that already has one
        pending is not queued twice.
        """
        request = request or RunRequest()
        with self._cond:
            entry = self.queue.state.entries.get(name)
            if entry is None:
                return False
            if entry.running:
                entry.pending_request = entry.pending_request or request
            elif not entry.request_queued:
                self.queue.push_item(entry, self.clock(), request)
            return True

    def wake(self, predicate: Callable[[Entry], bool]) -> list[str]:
        """Fire now every waiting entry for which *predicate* holds; return their names.

        After a database outage, the entries that were backing off try again at once.
        """
        now = self.clock()
        with self._cond:
            return self.queue.wake(predicate, now)

    def start(self) -> None:
        """Start the dispatcher thread."""
        if self._dispatcher is not None:
            raise RuntimeError("the scheduler has already been started")
        self._dispatcher = threading.Thread(
            target=self._dispatch_loop, name=f"{self.name}-dispatcher", daemon=True
        )
        self._dispatcher.start()

    @property
    def alive(self) -> bool:
        """Whether the dispatcher thread runs."""
        return self._dispatcher is not None and self._dispatcher.is_alive()

    def shutdown(self, timeout: float | None = None) -> list[str]:
        """Stop dispatching, wait up to *timeout* seconds for running tasks, and return the
        names of those still running then.

        Under the ``caller_runs`` policy the dispatcher may be running a task itself: it counts
        against the same *timeout*.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self.queue.stopping = True
            self._cond.notify_all()
        if self._dispatcher is not None and self._dispatcher is not threading.current_thread():
            self._dispatcher.join(timeout)

        def remaining() -> float | None:
            return None if deadline is None else max(deadline - time.monotonic(), 0.0)

        # Batches being claimed hand their firings to the pool: wait for them first. Those no
        # claim thread took up in time go unclaimed, for another instance (see ``_claim``).
        self._claim(self.claims.shutdown(remaining()))
        # Firings claimed ahead are this instance's to run: each at its time.
        with self._cond:
            claimed = self.queue.take_claimed()
        if claimed:
            self._run_calls(claimed)
        self.pool.shutdown(wait=True, timeout=remaining())
        self.dispatcher.drain(remaining())
        with self._cond:
            entries = self.queue.state.entries.values()
            return sorted(entry.name for entry in entries if entry.running)

    def _dispatch_loop(self) -> None:
        while True:
            taken = self.queue.take_due()
            if taken is None:
                return
            self._hand_over(*taken)
            # Not kept while the dispatcher waits: a burst's calls, and the locks and records
            # they hold, would stay in memory until the next burst.
            del taken

    def _hand_over(self, due: list[Due], calls: list[Call]) -> None:
        """Run the claimed calls whose time has come; hand the due firings to the claims."""
        if calls:
            self._run_calls(calls)
        if self.bounded:
            due = self._admit(due)
        self.claims.hand_over(due)

    def _admit(self, due: list[Due]) -> list[Due]:
        """Return the firings of *due* that the bounded pool has room for, and keep that room;
        give the others the rejection policy, before they are claimed."""
        admitted, refused = self._room.admit(due)
        for item in refused:
            if self.pool.rejection_policy is RejectionPolicy.CALLER_RUNS and not self.stopping:
                self._room.keep(1)  # claimed and run on this thread
                self._claim([item], here=True)
            else:
                stats = dataclasses.replace(self.pool.stats(), reserved=self._room.kept)
                self._reject(item, stats)
        return admitted

    def _reject(self, item: Due, stats: PoolStats) -> None:
        """Note a firing the pool has no room for; it is not claimed."""
        self.pool.count_rejection()
        logger.warning(
            "Pool %r has no room for %s (policy %s): %s",
            self.pool.name,
            item.entry.name,
            self.pool.rejection_policy.value,
            stats,
        )
        try:
            next_time = self.dispatcher.rejected(item.entry, item.firing, stats)
        except Exception:
            logger.exception("Handling the rejection of %s failed", item.entry.name)
            next_time = self._retry_time(item.entry)
        self._finish(item.entry, next_time, reschedule=True)

    def _claim(self, chunk: list[Due], *, here: bool = False) -> None:
        """Claim *chunk* (on a claim thread, or *here*) and hand each firing on as the
        dispatcher says."""
        if self.stopping:  # claimed now, these firings could not start before the exit
            self._unreserve(len(chunk))
            for item in chunk:
                self._finish(item.entry, None, reschedule=False)
            return
        try:
            outcomes: list[Outcome] = self.dispatcher.dispatch(
                [(item.entry, item.firing) for item in chunk]
            )
        except Exception:
            logger.exception("Claiming %d firings failed", len(chunk))
            self._unreserve(len(chunk))
            for item in chunk:
                self._finish(item.entry, self._retry_time(item.entry), reschedule=True)
            return
        calls: list[Call] = []
        for item, outcome in zip(chunk, outcomes, strict=True):
            if isinstance(outcome, Call):
                outcome.entry = item.entry
                calls.append(outcome)
            else:
                item.entry.failures = 0
                self._finish(item.entry, outcome, reschedule=True)
        self._unreserve(len(chunk) - len(calls))
        if here:
            with stopping_context(self._is_stopping):
                for call in calls:
                    self._unreserve(1)
                    self._run_call(call)
        elif calls:
            self._submit_calls(calls)

    def _unreserve(self, count: int) -> None:
        if count and self.bounded:
            self._room.release(count)

    def _submit_calls(self, calls: list[Call]) -> None:
        """Hand the claimed *calls* to the pool, those claimed ahead to the delay queue until
        their time."""
        with self._cond:
            ready = self.queue.wait_for_time(calls, time.time())
        if ready:
            self._run_calls(ready)

    def _run_calls(self, calls: list[Call]) -> None:
        """Run the claimed *calls* on the pool. Unbounded, as many workers as it may have (as
        many as if each were submitted alone) take them in turn; bounded, each takes its place
        in the queue, kept for it since it was admitted."""
        if self.bounded:
            self._unreserve(len(calls))
            for index, call in enumerate(calls):
                try:
                    self.pool.submit(_OneCall(self, call), label=_label(call))
                except RejectedWork:
                    pass  # _on_reject has recorded it and rescheduled the entry
                except RuntimeError:
                    # Claimed already: they must run. No worker could start (a thread limit,
                    # or the pool is shutting down): this thread runs them.
                    _Calls(self, calls[index:], None)()
                    return
            return
        # A burst (at a stop, those claimed ahead wait for their times: no burst).
        burst = bursts.begin() if len(calls) > 1 and not self.stopping else None
        work = _Calls(self, calls, burst)
        try:
            self.pool.submit(work, label="claimed firings", must_run=True)
        except RuntimeError:
            # Claimed already: they must run. No worker could start (a thread limit, or the
            # pool is shutting down), so this thread runs them.
            work()

    def _is_stopping(self) -> bool:
        """What ``shutdown_requested()`` asks in the tasks this scheduler runs."""
        return self.stopping

    def _run_call(self, call: Call) -> None:
        """Run a claimed firing on a worker thread, no earlier than its time (in a
        ``stopping_context`` of this scheduler)."""
        entry = call.entry
        assert entry is not None
        # Claimed ahead, and handed over at a stop: the dispatcher no longer waits for it.
        if call.at is not None and (wait := call.at.timestamp() - time.time()) > 0:
            time.sleep(wait)
        try:
            call.run(self._done)
        except Exception:
            logger.exception("Running %s failed outside the task itself", entry.name)
            self._finish(entry, self._retry_time(entry), reschedule=True)

    def _call_done(self, call: Call, next_time: datetime | None) -> None:
        entry = call.entry
        assert entry is not None
        entry.failures = 0
        self._finish(entry, next_time, reschedule=True)

    def _on_reject(self, item: Work, stats: PoolStats, policy: RejectionPolicy) -> None:
        """A call that the bounded pool dropped: ``discard_oldest`` made room with it (or the
        pool had less room than it said)."""
        if policy is RejectionPolicy.CALLER_RUNS and not self.stopping:
            return  # the pool runs it in the submitting thread
        one: _OneCall = item.fn  # type: ignore[assignment]
        entry = one.call.entry
        assert entry is not None
        try:
            next_time = one.call.reject(stats)
        except Exception:
            logger.exception("Handling the rejection of %s failed", entry.name)
            next_time = self._retry_time(entry)
        self._finish(entry, next_time, reschedule=True)

    def _retry_time(self, entry: Entry) -> datetime:
        """After a dispatch error, try again later, never at once: a failure that repeats must
        not become a busy loop."""
        entry.failures += 1
        delay = min(_RETRY_MIN * 2 ** (entry.failures - 1), _RETRY_MAX)
        return self.clock() + timedelta(seconds=delay)

    def _finish(self, entry: Entry, next_time: datetime | None, *, reschedule: bool) -> None:
        with self._cond:
            entry.running = False
            if self.queue.state.entries.get(entry.name) is not entry:
                self._replaced(entry)
                return
            if reschedule:
                self.queue.push(entry, next_time)
            if entry.pending_request is not None:
                request, entry.pending_request = entry.pending_request, None
                self.queue.push_item(entry, self.clock(), request)

    def _replaced(self, entry: Entry) -> None:
        """The run of *entry*, replaced or removed since it began, has ended: schedule the
        entry that waited for it, if any, with the run request that waited."""
        name = entry.name
        if self._draining.get(name) is entry:
            del self._draining[name]
        waiting = self._successors.get(name)
        if waiting is None or waiting[0] is not entry:
            return
        del self._successors[name]
        successor = waiting[1]
        successor.running = False
        self.queue.push(successor, self.dispatcher.first_fire_time(successor, now=self.clock()))
        request = entry.pending_request or successor.pending_request
        entry.pending_request = successor.pending_request = None
        if request is not None:
            self.queue.push_item(successor, self.clock(), request)


def _label(call: Call) -> str:
    return call.entry.name if call.entry is not None else "claimed firing"
