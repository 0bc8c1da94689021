"""The batches of due firings that wait for the claim threads, and those threads.

The dispatcher hands its due firings over here, cut into batches of ``BATCH_SIZE`` (see
``in_batches``). Two claim threads (one on SQLite) take them up, the earliest fire time first
(that of the hand-over a batch came in, so that a hand-over's batches keep their order): when
the scheduler is behind, the late firings go before those claimed ahead of their time, which
have time to spare. Firings handed over a few at a time join the batch that still waits for a
thread, rather than wait in small batches of their own. At a stop, the batches no thread took
up in time are given back unclaimed.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
import threading
from collections.abc import Callable
from datetime import datetime

from .delay_queue import BATCH_SIZE, Due, in_batches
from .pool import WorkerPool

__all__ = ["CLAIM_THREADS", "ClaimQueue", "claim_threads_for"]

#: Threads that claim batches: one waits on the database while the other works.
CLAIM_THREADS = 2


def claim_threads_for(vendor: str) -> int:
    """Return how many claim threads a database of *vendor* is given.

    SQLite takes one writer at a time, and a claim holds the write lock for its whole
    transaction: a second claim thread only waited for it (SQLite's busy handler sleeps between
    tries), on a connection whose page cache lives in this process. With one, a scheduler of
    10,000 tasks due every second kept about 1,000 bytes less per task (RSS, two runs each of
    ``bench_end_to_end.py --databases sqlite``), at the same latency.
    """
    return 1 if vendor == "sqlite" else CLAIM_THREADS


@dataclasses.dataclass(order=True, slots=True)
class _Batch:
    """Due firings waiting for a claim thread, the most urgent first: by the earliest fire
    time of the hand-over they came in (a run request comes first of all), then in the order
    handed over. The batches of one hand-over share its time, so that they keep the order
    ``in_batches`` gave them, which differs from one instance to the next."""

    earliest: float
    sequence: int
    firings: list[Due] = dataclasses.field(compare=False)


def _earliest(firings: list[Due]) -> float:
    """The earliest fire time of *firings* as a timestamp (0 for a run request).

    Runs on the dispatcher thread, over whole bursts. The firings of a burst share one fire
    time object (see ``DelayQueue.push_item``), so a time is converted only when it differs
    from the one before: 0.1 ms for a burst of 10,000, against 2 ms converting each."""
    earliest, last = math.inf, None
    for item in firings:
        firing = item.firing
        if firing is last:
            continue
        last = firing
        at = firing.timestamp() if isinstance(firing, datetime) else 0.0
        if at < earliest:
            earliest = at
    return earliest


class ClaimQueue:
    """Hand due firings to *claim* on the claim threads, in batches, the most urgent first."""

    def __init__(
        self,
        claim: Callable[[list[Due]], None],
        *,
        keep_alive: float,
        name: str,
        on_exit: Callable[[], object] | None,
        starts: Callable[[], float] = random.random,
        threads: int = CLAIM_THREADS,
    ) -> None:
        self._claim = claim
        self._threads = WorkerPool(
            core_size=0,
            max_size=threads,
            queue_capacity=None,
            keep_alive=keep_alive,
            name=name,
            on_exit=on_exit,
        )
        #: The batches not taken up yet, a heap. The lock guards it and ``_joinable``.
        self._batches: list[_Batch] = []
        self._lock = threading.Lock()
        self._sequence = itertools.count()
        #: The last batch made of a hand-over smaller than a batch, while it waits: later
        #: small hand-overs join it (see ``_join``).
        self._joinable: _Batch | None = None
        #: Where each hand-over's batches begin, in [0, 1) (see ``in_batches``).
        self._starts = starts

    @property
    def threads(self) -> int:
        """How many batches are claimed at once, at most."""
        return self._threads.max_size

    @property
    def waiting(self) -> int:
        """How many firings wait for a claim thread."""
        with self._lock:
            return sum(len(batch.firings) for batch in self._batches)

    def hand_over(self, due: list[Due]) -> None:
        """Queue *due* for the claim threads, in batches. When no claim thread can start (a
        thread limit, or a shutdown), the calling thread claims in its place."""
        if not due:
            return
        small = len(due) < BATCH_SIZE
        if small:
            due = self._join(due)
            if not due:
                return
        earliest = _earliest(due)
        chunks = in_batches(due, BATCH_SIZE, start=self._starts())
        del due
        for chunk in chunks:
            batch = _Batch(earliest, next(self._sequence), chunk)
            with self._lock:
                heapq.heappush(self._batches, batch)
                if small:
                    self._joinable = batch
            try:
                self._threads.submit(self._claim_next, label="claims")
            except RuntimeError:
                self._claim_next()

    def shutdown(self, timeout: float | None) -> list[Due]:
        """Wait up to *timeout* seconds for the batches handed over to be claimed; return the
        firings of those that no claim thread took up by then."""
        self._threads.shutdown(wait=True, timeout=timeout)
        with self._lock:
            left, self._batches, self._joinable = self._batches, [], None
        return [item for batch in sorted(left) for item in batch.firings]

    def _join(self, due: list[Due]) -> list[Due]:
        """Put what it has room for of *due* in the waiting batch of earlier small hand-overs;
        return the rest.

        Runs that end behind their schedule put their entries back already due, a few at a
        time. While the claim threads are busy, those join a batch that waits for them rather
        than wait in batches of their own: each batch is a transaction, and claims of a few
        firings each would fall further behind."""
        with self._lock:
            waiting = self._joinable
            if waiting is None:
                return due
            room = BATCH_SIZE - len(waiting.firings)
            if room <= 0:
                self._joinable = None
                return due
            joining, due = due[:room], due[room:]
            waiting.firings += joining
            earliest = _earliest(joining)
            if earliest < waiting.earliest:
                waiting.earliest = earliest
                heapq.heapify(self._batches)
        return due

    def _claim_next(self) -> None:
        """Claim the most urgent waiting batch. Each batch handed over makes one call here."""
        with self._lock:
            if not self._batches:
                return
            batch = heapq.heappop(self._batches)
            if batch is self._joinable:
                self._joinable = None
        self._claim(batch.firings)
