"""The scheduler's delay queue: every entry by the time it fires next, the run requests, and the
firings claimed ahead of their time, in one heap of times. No I/O, no threads of its own: the
scheduler's dispatcher waits on its condition and takes what falls due.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .calls import Call, Entry, Firing, RunRequest

__all__ = [
    "BATCH_SIZE",
    "CLAIM_AHEAD_MAX",
    "CLAIM_AHEAD_PER_FIRING",
    "DelayQueue",
    "Due",
    "claim_ahead",
]

#: Firings due at one instant are claimed in batches of at most this many; the first batch's
#: tasks start while the next one is claimed.
BATCH_SIZE = 100
#: A burst of firings due at one instant is claimed ahead of that instant, this many seconds
#: per firing (100 firings: 50 ms ahead, 1,000: half a second, 10,000: five), so that its
#: claims (and, for enqueued firings, the enqueues in the claim's transaction) are over when it
#: is due; each claimed firing still starts at its time. A lone firing is claimed at its time.
CLAIM_AHEAD_PER_FIRING = 0.0005
#: ...and never longer ahead than this.
CLAIM_AHEAD_MAX = 10.0
#: The kinds of heap items: the entries scheduled at a time (see ``_State.slots``), a run
#: request, and the firings claimed ahead that wait for their time. Items due at the same time
#: come in this order: claimed, requests, then the schedule.
_SLOT, _REQUEST, _CLAIMED = 0, -1, -2


def claim_ahead(count: int) -> float:
    """Return how many seconds before its instant a burst of *count* firings is claimed."""
    if count <= 1:
        return 0.0  # claimed at its time, within a few milliseconds
    return min(count * CLAIM_AHEAD_PER_FIRING, CLAIM_AHEAD_MAX)


#: The sizes at which a growing burst (its entries pushed back one by one as their runs end)
#: wakes the dispatcher, which then waits for the burst's new claim-ahead time; past
#: ``BATCH_SIZE``, every ``BATCH_SIZE`` more firings do.
_REWAKE_AT = frozenset({2, 8, 32, BATCH_SIZE})


@dataclass(slots=True)  # not frozen: a frozen dataclass is 3x slower to create
class Due:
    """One firing taken from the delay queue: *entry* for *firing*."""

    entry: Entry
    firing: Firing


#: An item of the heap: (when, _SLOT) for the entries scheduled at *when*, (when, _CLAIMED)
#: for the calls claimed ahead that wait for *when* (in ``_State.claimed``), or (when,
#: _REQUEST, entry, request) for a run request. Requests due at the same time are ordered by
#: entry name.
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
    #: How many firings wait in the delay queue, by instant: a burst.
    bursts: dict[float, int] = field(default_factory=dict)
    #: The last instant whose burst was taken ahead.
    taken_ahead: float = 0.0
    #: The firings claimed ahead, by the instant they wait for (the heap holds one item for
    #: each instant).
    claimed: dict[float, list[Call]] = field(default_factory=dict)


class DelayQueue:
    """Entries by their next fire time. Every method but ``take_due`` expects its caller to
    hold ``cond``."""

    #: ``take_due`` wakes at least this often, so a wall-clock jump is noticed.
    MAX_SLEEP = 30.0

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.state = _State()
        self.stopping = False
        self._recent: tuple[datetime | None, float] = (None, 0.0)  # the last time pushed

    def push(self, entry: Entry, fire_time: datetime | None) -> None:
        """Schedule *entry* at *fire_time* (``None``: never again)."""
        entry.next_fire_time = fire_time
        if fire_time is not None:
            self.push_item(entry, fire_time, fire_time)

    def push_item(self, entry: Entry, when: datetime, firing: Firing) -> None:
        """Queue *firing* of *entry* at *when*: its schedule, or a run request."""
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
        slot = self.state.slots.get(at)
        if slot is None:
            self.state.slots[at] = [entry]
            self._heap_push(at, _SLOT)
        else:
            slot.append(entry)
        bursts = self.state.bursts
        count = bursts[at] = bursts.get(at, 0) + 1
        if at == self.state.taken_ahead and count % BATCH_SIZE == 0:
            # Late for a burst taken ahead (the runs of tasks due every second end while the
            # next second's burst is claimed): claimed ahead too, a whole batch at a time. The
            # rest goes at the burst's instant. Woken for each one, the dispatcher would hand
            # over batches of one or two, each a transaction of its own.
            self.cond.notify()
        elif (
            count in _REWAKE_AT or (count > BATCH_SIZE and count % BATCH_SIZE == 1)
        ) and self.state.heap[0][0] == at:
            self.cond.notify()  # the next burst grew: it may be claimed earlier

    def wait_for_time(self, calls: list[Call], now: float) -> list[Call]:
        """Keep the claimed *calls* whose time has not come in the queue until it does;
        return the others."""
        ready: list[Call] = []
        claimed = self.state.claimed
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
        return ready

    def take_claimed(self) -> list[Call]:
        """Take every call claimed ahead, in the order of their times (at a stop)."""
        claimed = sorted(self.state.claimed.items())
        self.state.claimed.clear()
        return [call for _, calls in claimed for call in calls]

    def wake(self, predicate: Callable[[Entry], bool], now: datetime) -> list[str]:
        """Move every waiting entry for which *predicate* holds to *now*; return their names."""
        woken = []
        for entry in self.state.entries.values():
            if not entry.running and entry.next_fire_time is not None and predicate(entry):
                self.push(entry, min(entry.next_fire_time, now))
                woken.append(entry.name)
        return woken

    def _heap_push(self, at: float, kind: int, *item: Any) -> None:
        was_first = not self.state.heap or at < self.state.heap[0][0]
        heapq.heappush(self.state.heap, (at, kind, *item))
        if was_first:
            self.cond.notify()

    def take_due(self) -> tuple[list[Due], list[Call]] | None:
        """Wait until entries are due, or a burst is to be claimed ahead, and return them with
        the firings claimed ahead whose time has come; None once the queue stops."""
        with self.cond:
            state = self.state
            while not self.stopping:
                heap = state.heap
                now = time.time()
                limit = wake = heap[0][0] if heap else now + self.MAX_SLEEP
                if wake > now and wake != state.taken_ahead:
                    ahead = claim_ahead(state.bursts.get(wake, 0))
                    if wake - ahead <= now:
                        # Its firings leave ahead of time, now and as they come.
                        state.taken_ahead = wake
                    else:
                        wake -= ahead
                if limit != state.taken_ahead or limit <= now or not state.bursts.get(limit):
                    limit = now
                due, calls = self.pop(limit, now)
                if due or calls:
                    return due, calls
                self.cond.wait(min(wake - now, self.MAX_SLEEP))
            return None

    def pop(self, limit: float, now: float) -> tuple[list[Due], list[Call]]:
        """Pop the heap up to *limit*: the due entries and the claimed calls due by *now*.

        A *limit* after *now* takes a burst ahead: its scheduled firings leave the heap; run
        requests and claimed calls wait there for their time."""
        heap, bursts = self.state.heap, self.state.bursts
        due: list[Due] = []
        calls: list[Call] = []
        kept: list[_Item] = []
        while heap and heap[0][0] <= limit:
            item = heapq.heappop(heap)
            at, kind = item[0], item[1]
            if bursts:
                bursts.pop(at, None)
            if kind == _SLOT:
                self._pop_slot(at, due)
                continue
            if kind == _CLAIMED:
                if at > now:
                    kept.append(item)
                else:
                    calls += self.state.claimed.pop(at, ())
                continue
            entry, firing = item[2], item[3]  # type: ignore[misc]
            if at > now:
                kept.append(item)
                continue
            entry.request_queued = False
            # The entry of that name now: it may have been replaced since the run was asked
            # for (the request goes to its successor) or removed.
            current = self.state.entries.get(entry.name)
            if current is None:
                continue
            if current.running:
                current.pending_request = current.pending_request or firing
                continue
            current.running = True
            due.append(Due(current, firing))
        for item in kept:
            heapq.heappush(heap, item)
        return due, calls

    def _pop_slot(self, at: float, due: list[Due]) -> None:
        """Take the entries scheduled at *at* into *due*."""
        current = None  # the last fire time found at *at*: entries due together share it
        for entry in self.state.slots.pop(at):
            firing = entry.next_fire_time
            if entry.running or firing is None:
                continue  # running (rescheduled when it ends), or never again
            if firing is not current:
                if firing.timestamp() != at:
                    continue  # rescheduled since: it waits in another slot
                current = firing
            entry.running = True  # and so taken once, however often the slot lists it
            due.append(Due(entry, firing))


def in_batches(due: list[Due], size: int, *, start: float) -> list[list[Due]]:
    """Split *due* into batches of at most *size* firings, in the order to claim them.

    Batches are cut from the firings in name order, so that every instance cuts the same
    batches, and the order begins at the batch at fraction *start* (in [0, 1)) of the list, then
    wraps around. Instances that start at different batches claim different rows at the same
    time instead of queueing behind each other's locks; when one reaches a batch another has
    claimed, reading its rows shows the fire times taken, and it moves on without a write.
    """
    ordered = sorted(due, key=lambda item: item.entry.name)
    batches = [ordered[first : first + size] for first in range(0, len(ordered), size)]
    first = int(start * len(batches))
    return batches[first:] + batches[:first]
