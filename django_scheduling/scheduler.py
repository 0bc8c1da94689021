"""The delay queue, the dispatcher thread and the worker pool.

One dispatcher thread keeps every task in a heap of times, each with the list of the tasks whose
next fire time it is. It sleeps until the earliest one is due (or until something earlier is
added), pops every due entry in one hold of the lock and hands each to the worker pool. A task
goes back into the delay queue only when its run has ended, so one task never runs twice at
once in this process. The dispatcher does no I/O:
what a firing does (locking, history) is the runner's business, on a worker thread (see
``execution.TaskRunner``), and the runner returns when the entry fires next. Firings the runner
can batch go, in batches of ``BATCH_SIZE``, to the claim threads; each claimed firing comes back
as a ``Call`` for the pool, and reports its next fire time once its end is recorded.
"""

from __future__ import annotations

import enum
import functools
import heapq
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from .clock import utcnow
from .context import shutdown_requested, stopping_context
from .pool import PoolStats, RejectedWork, RejectionPolicy, Work, WorkerPool
from .schedules.decisions import Firing, RunRequest

__all__ = ["Scheduler", "Entry", "Runner", "RunRequest", "shutdown_requested"]

logger = logging.getLogger(__name__)

#: After a runner error, an entry is tried again this long later, doubling up to a minute.
_RETRY_MIN, _RETRY_MAX = 1.0, 60.0
#: Firings due at one instant are claimed in batches of at most this many; the first batch's
#: tasks start while the next one is claimed.
BATCH_SIZE = 100
#: Threads that claim batches: one waits on the database while the other works.
CLAIM_THREADS = 2
#: A burst of more than ``BATCH_SIZE`` firings due at one instant is claimed ahead of that
#: instant, this many seconds per firing (1,000 firings: half a second ahead, 10,000: five),
#: so that its claims are over when it is due; each claimed firing still starts at its time.
CLAIM_AHEAD_PER_FIRING = 0.0005
#: ...and never longer ahead than this.
CLAIM_AHEAD_MAX = 10.0
#: The kinds of heap items: the entries scheduled at a time (see ``_State.slots``), a run
#: request, and the firings claimed ahead that wait for their time. Items due at the same time
#: come in this order: claimed, requests, then the schedule.
_SLOT, _REQUEST, _CLAIMED = 0, -1, -2


def claim_ahead(count: int) -> float:
    """Return how many seconds before its instant a burst of *count* firings is claimed."""
    if count <= BATCH_SIZE:
        return 0.0  # one batch: claimed at its time, within a few milliseconds
    return min(count * CLAIM_AHEAD_PER_FIRING, CLAIM_AHEAD_MAX)


class Call:
    """A firing that the runner has claimed in a batch: ``run(done)`` runs the task on a
    worker thread, and ``done(next_time)`` is called once its end is recorded, possibly later
    and from another thread. Runners subclass it (see ``FunctionCall``); a burst claimed ahead
    keeps one per firing until its instant."""

    __slots__ = ("at", "entry")

    def __init__(self, at: datetime | None = None) -> None:
        #: Claimed ahead of its time: it starts no earlier than this.
        self.at = at
        #: The entry it fires, set by the scheduler when the runner hands it over.
        self.entry: Entry | None = None

    def run(self, done: Callable[[datetime | None], None]) -> None:
        raise NotImplementedError


class FunctionCall(Call):
    """A ``Call`` that runs ``fn(done)``."""

    __slots__ = ("fn",)

    def __init__(
        self, fn: Callable[[Callable[[datetime | None], None]], None], at: datetime | None = None
    ) -> None:
        super().__init__(at)
        self.fn = fn

    def run(self, done: Callable[[datetime | None], None]) -> None:
        self.fn(done)


class Single(enum.Enum):
    """The runner's answer for a firing of a batch that it leaves to ``Runner.run``."""

    SINGLE = "single"


#: What ``Runner.run_batch`` says of each firing: when the entry fires next (it did not run
#: here), a ``Call`` to run, or ``SINGLE``.
Outcome = datetime | None | Call | Single
SINGLE = Single.SINGLE


@dataclass(eq=False, slots=True)
class Entry:
    """A task in the delay queue, with what the dispatcher needs to know of it."""

    name: str
    payload: Any = None
    running: bool = False
    #: A run asked for while the entry was running; it follows when the run ends.
    pending_request: RunRequest | None = None
    request_queued: bool = False  # a run request waits in the heap
    next_fire_time: datetime | None = None
    failures: int = 0  # runner errors in a row

    def __lt__(self, other: Entry) -> bool:
        return self.name < other.name


@dataclass(slots=True)  # not frozen: a frozen dataclass is 3x slower to create
class _Work:
    """One firing handed to the pool: *entry* for *firing*."""

    scheduler: Scheduler
    entry: Entry
    firing: Firing

    def __call__(self) -> None:
        self.scheduler._run_firing(self)


class _Calls:
    """Claimed firings whose time has come, run in order by the pool workers that drain
    them: a burst hands thousands over at once, and not one pool item each."""

    __slots__ = ("calls", "scheduler")

    def __init__(self, scheduler: Scheduler, calls: list[Call]) -> None:
        self.scheduler = scheduler
        calls.reverse()  # taken from the end: the first one first
        self.calls = calls

    def __call__(self) -> None:
        calls, run = self.calls, self.scheduler._run_call
        while True:
            try:
                call = calls.pop()  # atomic: each call is taken by one worker
            except IndexError:
                return
            run(call)


class Runner(Protocol):
    """What the scheduler asks of the code that runs firings."""

    def first_fire_time(self, entry: Entry, *, now: datetime) -> datetime | None: ...

    def run(self, entry: Entry, firing: Firing) -> datetime | None:
        """Run one firing and return when the entry fires next (``None``: never again)."""

    def rejected(self, entry: Entry, firing: Firing, stats: PoolStats) -> None:
        """Note a firing the pool rejected; called on the dispatcher thread: no I/O."""

    def next_after_rejection(self, entry: Entry, firing: Firing) -> datetime | None: ...


class BatchRunner(Runner, Protocol):
    """A runner that can also claim many firings at once."""

    def batchable(self, entry: Entry, firing: Firing) -> bool:
        """Return whether *firing* may go in a batch; no I/O."""

    def run_batch(self, items: list[tuple[Entry, Firing]]) -> list[Outcome]:
        """Claim the firings *items* together; never raise."""

    def drain(self, timeout: float | None) -> bool:
        """Wait until the ends of the runs started from batches are recorded."""


#: An item of the delay queue: (when, _SLOT) for the entries scheduled at *when*, (when,
#: _CLAIMED) for the calls claimed ahead that wait for *when* (in ``_State.claimed``), or
#: (when, _REQUEST, entry, request) for a run request. Requests due at the same time are
#: ordered by entry name.
_Item = tuple[float, int] | tuple[float, int, Entry, Any]


@dataclass
class _State:
    heap: list[_Item] = field(default_factory=list)
    #: The entries whose schedule is at each time, for the heap's one item of that time: tasks
    #: due together (a burst, every task of a cron line) cost a list slot each, not a heap
    #: item. An entry rescheduled since stays in its old slot, and is skipped there: its
    #: ``next_fire_time`` no longer matches.
    slots: dict[float, list[Entry]] = field(default_factory=dict)
    entries: dict[str, Entry] = field(default_factory=dict)
    #: How many firings the runner can batch wait in the delay queue, by instant: a burst.
    bursts: dict[float, int] = field(default_factory=dict)
    #: The last instant whose burst was taken ahead.
    taken_ahead: float = 0.0
    #: The firings claimed ahead, by the instant they wait for (the heap holds one item for
    #: each instant).
    claimed: dict[float, list[Call]] = field(default_factory=dict)


def in_batches(due: list[_Work], size: int, *, start: float) -> list[list[_Work]]:
    """Split *due* into batches of at most *size* firings, in the order to claim them.

    Batches are cut from the firings in name order, so that every instance cuts the same
    batches, and the order begins at the batch at fraction *start* (in [0, 1)) of the list, then
    wraps around. Instances that start at different batches claim different rows at the same
    time instead of queueing behind each other's locks; when one reaches a batch another has
    claimed, reading its rows shows the fire times taken, and it moves on without a write.
    """
    ordered = sorted(due, key=lambda work: work.entry.name)
    batches = [ordered[first : first + size] for first in range(0, len(ordered), size)]
    first = int(start * len(batches))
    return batches[first:] + batches[:first]


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
        queue_capacity: int | None = None,
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
        # A bounded queue keeps its rejection policies for every firing: one at a time.
        self._batches: WorkerPool | None = None
        if queue_capacity is None and hasattr(runner, "run_batch"):
            self._batches = WorkerPool(
                core_size=0,
                max_size=CLAIM_THREADS,
                queue_capacity=None,
                keep_alive=keep_alive,
                name=f"{name}-claims",
            )
        # Where each burst's claims begin (see ``in_batches``).
        self._random = random.Random()
        self.stopping = False
        self._recent: tuple[datetime | None, float] = (None, 0.0)  # the last time pushed
        self._state = _State()
        self._cond = threading.Condition()
        self._dispatcher: threading.Thread | None = None

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

    def entry(self, name: str) -> Entry | None:
        """Return the entry named *name*, if this scheduler has it."""
        return self._state.entries.get(name)  # one dict read: atomic, no lock needed

    def run_now(self, name: str, request: RunRequest | None = None) -> bool:
        """Queue a run of *name* outside its schedule, as soon as it is not running.

        Return False if the name is unknown. A request for an entry that already has one
        pending is not queued twice.
        """
        request = request or RunRequest()
        with self._cond:
            entry = self._state.entries.get(name)
            if entry is None:
                return False
            if entry.running:
                entry.pending_request = entry.pending_request or request
            elif not entry.request_queued:
                self._push_item(entry, self.clock(), request)
            return True

    def wake(self, predicate: Callable[[Entry], bool]) -> list[str]:
        """Fire now every waiting entry for which *predicate* holds; return their names.

        After a database outage, the entries that were backing off try again at once.
        """
        now = self.clock()
        woken = []
        with self._cond:
            for entry in self._state.entries.values():
                if not entry.running and entry.next_fire_time is not None and predicate(entry):
                    self._push(entry, min(entry.next_fire_time, now))
                    woken.append(entry.name)
        return woken

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
            self.stopping = True
            self._cond.notify_all()
        if self._dispatcher is not None and self._dispatcher is not threading.current_thread():
            self._dispatcher.join(timeout)

        def remaining() -> float | None:
            return None if deadline is None else max(deadline - time.monotonic(), 0.0)

        if self._batches is not None:
            # Batches being claimed hand their firings to the pool: wait for them first.
            self._batches.shutdown(wait=True, timeout=remaining())
            # Firings claimed ahead are this instance's to run: each at its time.
            with self._cond:
                claimed = sorted(self._state.claimed.items())
                self._state.claimed.clear()
            if claimed:
                self._run_calls([call for _, calls in claimed for call in calls])
        self.pool.shutdown(wait=True, timeout=remaining())
        if self._batches is not None:
            self.runner.drain(remaining())  # type: ignore[attr-defined]
        with self._cond:
            return sorted(entry.name for entry in self._state.entries.values() if entry.running)

    # -- the delay queue -----------------------------------------------------------------------

    def _push(self, entry: Entry, fire_time: datetime | None) -> None:
        entry.next_fire_time = fire_time
        if fire_time is not None:
            self._push_item(entry, fire_time, fire_time)

    def _push_item(self, entry: Entry, when: datetime, firing: Firing) -> None:
        recent, recent_at = self._recent
        if recent is not None and when == recent and when.tzinfo is recent.tzinfo:
            # Tasks due together share one time object and its timestamp in the heap.
            if firing is when:
                firing = entry.next_fire_time = recent
            when, at = recent, recent_at
        else:
            at = when.timestamp()
            self._recent = (when, at)
        if isinstance(firing, RunRequest):
            # Not superseded by a later push of the entry's schedule: an item of its own.
            entry.request_queued = True
            self._heap_push(at, _REQUEST, entry, firing)
            return
        slot = self._state.slots.get(at)
        if slot is None:
            self._state.slots[at] = [entry]
            self._heap_push(at, _SLOT)
        else:
            slot.append(entry)
        if self._batches is None:
            return
        if self.runner.batchable(entry, firing):  # type: ignore[attr-defined]
            bursts = self._state.bursts
            count = bursts[at] = bursts.get(at, 0) + 1
            if at == self._state.taken_ahead and count == 1:
                self._cond.notify()  # late for a burst taken ahead: claimed ahead too
            elif count > BATCH_SIZE and count % BATCH_SIZE == 1 and self._state.heap[0][0] == at:
                self._cond.notify()  # the next burst grew: it may be claimed earlier

    def _heap_push(self, at: float, kind: int, *item: Any) -> None:
        was_first = not self._state.heap or at < self._state.heap[0][0]
        heapq.heappush(self._state.heap, (at, kind, *item))
        if was_first:
            self._cond.notify()

    def _dispatch_loop(self) -> None:
        while True:
            taken = self._take_due()
            if taken is None:
                return
            self._hand_over(*taken)
            # Not kept while the dispatcher waits: a burst's calls, and the locks and records
            # they hold, would stay in memory until the next burst.
            del taken

    def _hand_over(self, due: list[_Work], calls: list[Call]) -> None:
        """Hand the due firings and the claimed calls whose time has come to the pool (and
        the batchable firings to the claim threads)."""
        if calls:
            self._run_calls(calls)
        if self._batches is not None:
            due = self._submit_batches(due)
        for firing in due:
            self._submit(firing)

    def _submit_batches(self, due: list[_Work]) -> list[_Work]:
        """Hand the firings the runner can batch to the claim threads, in batches; return
        the others."""
        assert self._batches is not None
        runner: BatchRunner = self.runner  # type: ignore[assignment]
        batch: list[_Work] = []
        alone: list[_Work] = []
        for work in due:
            (batch if runner.batchable(work.entry, work.firing) else alone).append(work)
        if not batch:
            return alone
        chunks = in_batches(batch, BATCH_SIZE, start=self._random.random())
        del batch
        for index, chunk in enumerate(chunks):
            try:
                self._batches.submit(functools.partial(self._claim, chunk), label="claims")
            except RuntimeError:
                # No claim thread could start: the rest one at a time, in the pool.
                alone += [work for rest in chunks[index:] for work in rest]
                break
        return alone

    def _claim(self, chunk: list[_Work]) -> None:
        """Claim *chunk* (on a claim thread) and hand each firing on as the runner says."""
        runner: BatchRunner = self.runner  # type: ignore[assignment]
        if self.stopping:  # claimed now, these firings could not start before the exit
            for work in chunk:
                self._finish(work.entry, None, reschedule=False)
            return
        try:
            outcomes = runner.run_batch([(work.entry, work.firing) for work in chunk])
        except Exception:
            logger.exception("Claiming %d firings failed", len(chunk))
            for work in chunk:
                self._finish(work.entry, self._retry_time(work.entry), reschedule=True)
            return
        calls: list[Call] = []
        for work, outcome in zip(chunk, outcomes, strict=True):
            if isinstance(outcome, Call):
                outcome.entry = work.entry
                calls.append(outcome)
            elif outcome is SINGLE:
                if isinstance(work.firing, datetime) and work.firing.timestamp() > time.time():
                    # Taken ahead with its burst: it goes alone, at its time, not before.
                    call = FunctionCall(functools.partial(self._run_single, work), work.firing)
                    call.entry = work.entry
                    calls.append(call)
                else:
                    self._submit(work)
            else:
                work.entry.failures = 0
                self._finish(work.entry, outcome, reschedule=True)
        if calls:
            self._submit_calls(calls)

    def _run_single(self, work: _Work, done: Callable[[datetime | None], None]) -> None:
        done(self.runner.run(work.entry, work.firing))

    def _submit_calls(self, calls: list[Call]) -> None:
        """Hand the claimed *calls* to the pool, those claimed ahead to the delay queue until
        their time."""
        now = time.time()
        ready: list[Call] = []
        with self._cond:
            claimed = self._state.claimed
            for call in calls:
                at = call.at.timestamp() if call.at is not None else 0.0
                if at <= now or self.stopping:
                    ready.append(call)
                    continue
                waiting = claimed.get(at)
                if waiting is None:
                    waiting = claimed[at] = []
                    self._heap_push(at, _CLAIMED)
                waiting.append(call)
        if ready:
            self._run_calls(ready)

    def _run_calls(self, calls: list[Call]) -> None:
        """Run the claimed *calls* on the pool: as many workers as it may have (as many as
        if each were submitted alone) take them in turn."""
        work = _Calls(self, calls)
        for _ in range(min(len(calls), self.pool.max_size)):
            try:
                self.pool.submit(work, label="claimed firings", must_run=True)
            except RuntimeError:
                # Claimed already: they must run. No worker could start (a thread limit, or
                # the pool is shutting down), so this thread runs those no worker took.
                work()
                return

    def _run_call(self, call: Call) -> None:
        """Run a claimed firing on a worker thread, no earlier than its time."""
        entry = call.entry
        assert entry is not None
        # Claimed ahead, and handed over at a stop: the dispatcher no longer waits for it.
        if call.at is not None and (wait := call.at.timestamp() - time.time()) > 0:
            time.sleep(wait)
        try:
            with stopping_context(lambda: self.stopping):
                call.run(functools.partial(self._call_done, entry))
        except Exception:
            logger.exception("Running %s failed outside the task itself", entry.name)
            self._finish(entry, self._retry_time(entry), reschedule=True)

    def _call_done(self, entry: Entry, next_time: datetime | None) -> None:
        entry.failures = 0
        self._finish(entry, next_time, reschedule=True)

    def _take_due(self) -> tuple[list[_Work], list[Call]] | None:
        """Wait until entries are due, or a burst is to be claimed ahead, and return them with
        the firings claimed ahead whose time has come; None once the scheduler stops."""
        with self._cond:
            state = self._state
            while not self.stopping:
                heap = state.heap
                now = time.time()
                limit = wake = heap[0][0] if heap else now + self.MAX_SLEEP
                if wake > now and wake != state.taken_ahead:
                    ahead = claim_ahead(state.bursts.get(wake, 0))
                    if wake - ahead <= now:
                        # Its batchable firings leave ahead of time, now and as they come.
                        state.taken_ahead = wake
                    else:
                        wake -= ahead
                if limit != state.taken_ahead or limit <= now or not state.bursts.get(limit):
                    limit = now
                due, calls = self._pop(limit, now)
                if due or calls:
                    return due, calls
                self._cond.wait(min(wake - now, self.MAX_SLEEP))
            return None

    def _pop(self, limit: float, now: float) -> tuple[list[_Work], list[Call]]:
        """Pop the heap up to *limit*: the due entries and the claimed calls due by *now*.

        A *limit* after *now* takes a burst ahead: only firings the runner batches leave the
        heap; the others wait there for their time."""
        heap, bursts = self._state.heap, self._state.bursts
        due: list[_Work] = []
        calls: list[Call] = []
        kept: list[_Item] = []
        while heap and heap[0][0] <= limit:
            item = heapq.heappop(heap)
            at, kind = item[0], item[1]
            if bursts:
                bursts.pop(at, None)
            if kind == _SLOT:
                if staying := self._pop_slot(at, now, due):
                    self._state.slots[at] = staying
                    kept.append(item)
                continue
            if kind == _CLAIMED:
                if at > now:
                    kept.append(item)
                else:
                    calls += self._state.claimed.pop(at, ())
                continue
            entry, firing = item[2], item[3]  # type: ignore[misc]
            if at > now:
                kept.append(item)
                continue
            entry.request_queued = False
            if entry.running:
                entry.pending_request = entry.pending_request or firing
                continue
            entry.running = True
            due.append(_Work(self, entry, firing))
        for item in kept:
            heapq.heappush(heap, item)
        return due, calls

    def _pop_slot(self, at: float, now: float, due: list[_Work]) -> list[Entry]:
        """Take the entries scheduled at *at* into *due*; return those that stay (taking a
        burst ahead, those the runner does not batch)."""
        runner: Any = self.runner
        staying: list[Entry] = []
        current = None  # the last fire time found at *at*: entries due together share it
        for entry in self._state.slots.pop(at):
            firing = entry.next_fire_time
            if entry.running or firing is None:
                continue  # running (rescheduled when it ends), or never again
            if firing is not current:
                if firing.timestamp() != at:
                    continue  # rescheduled since: it waits in another slot
                current = firing
            if at > now and not runner.batchable(entry, firing):
                staying.append(entry)
                continue
            entry.running = True  # and so taken once, however often the slot lists it
            due.append(_Work(self, entry, firing))
        return staying

    def _submit(self, work: _Work) -> None:
        try:
            self.pool.submit(work, label=work.entry.name)
        except RejectedWork:
            pass  # _on_reject has recorded it and rescheduled the entry
        except RuntimeError:
            if self.stopping:  # the pool is shut down: the firing will not run
                self._finish(work.entry, None, reschedule=False)
                return
            # No thread could be started (a thread limit, memory): try again later.
            logger.exception("Could not hand %s to the pool", work.entry.name)
            self._finish(work.entry, self._retry_time(work.entry), reschedule=True)

    def _on_reject(self, item: Work, stats: PoolStats, policy: RejectionPolicy) -> None:
        # Claimed calls are submitted with must_run: only a _Work is ever rejected.
        work: _Work = item.fn  # type: ignore[assignment]
        if policy is RejectionPolicy.CALLER_RUNS and not self.stopping:
            return  # the pool runs it in the dispatcher thread
        entry = work.entry
        try:
            self.runner.rejected(entry, work.firing, stats)
            next_time = self.runner.next_after_rejection(entry, work.firing)
        except Exception:
            logger.exception("Handling the rejection of %s failed", entry.name)
            next_time = self._retry_time(entry)
        self._finish(entry, next_time, reschedule=True)

    # -- running one firing (in a worker thread) -----------------------------------------------

    def _run_firing(self, work: _Work) -> None:
        entry = work.entry
        next_time: datetime | None = None
        try:
            with stopping_context(lambda: self.stopping):
                next_time = self.runner.run(entry, work.firing)
            entry.failures = 0
        except Exception:
            logger.exception("Running %s failed outside the task itself", entry.name)
            next_time = self._retry_time(entry)
        finally:
            self._finish(entry, next_time, reschedule=True)

    def _retry_time(self, entry: Entry) -> datetime:
        """After a runner error, try again later, never at once: a failure that repeats must
        not become a busy loop."""
        entry.failures += 1
        delay = min(_RETRY_MIN * 2 ** (entry.failures - 1), _RETRY_MAX)
        return self.clock() + timedelta(seconds=delay)

    def _finish(self, entry: Entry, next_time: datetime | None, *, reschedule: bool) -> None:
        with self._cond:
            entry.running = False
            if reschedule:
                self._push(entry, next_time)
            if entry.pending_request is not None:
                request, entry.pending_request = entry.pending_request, None
                self._push_item(entry, self.clock(), request)
