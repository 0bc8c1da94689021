"""What the scheduler and the firing pipeline hand each other.

The scheduler keeps an ``Entry`` per task in its delay queue. When entries fall due it hands
them, in batches, to a ``Dispatcher`` (the firing pipeline), which answers for each firing with
an ``Outcome``: when the entry fires next (it does not run here now), or a ``Call``, a run
claimed for this process, which the scheduler starts on its worker pool. A call reports the
entry's next fire time through ``done`` once its end is recorded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from ..schedules.decisions import Firing, RunRequest
from .pool import PoolStats

__all__ = ["Call", "Dispatcher", "Entry", "FunctionCall", "Firing", "Outcome", "RunRequest"]

#: Told, with the call, when the entry of the call fires next, once the call's end is recorded.
#: The call is passed rather than bound in: one callable serves every call, where a burst's
#: runs wait for the writer by the thousand.
Done = Callable[["Call", datetime | None], None]


class Call:
    """A run claimed for this process: ``run(done)`` runs it on a worker thread, and
    ``done(call, next_time)`` is called once its end is recorded, possibly later and from another
    thread. A burst claimed ahead keeps one per firing until its instant."""

    __slots__ = ("at", "entry")

    def __init__(self, at: datetime | None = None) -> None:
        #: Claimed ahead of its time: it starts no earlier than this.
        self.at = at
        #: The entry it fires, set by the scheduler when the call is handed over.
        self.entry: Entry | None = None

    def run(self, done: Done) -> None:
        raise NotImplementedError

    def reject(self, stats: PoolStats) -> datetime | None:
        """The pool dropped this call before it started (``discard_oldest``): record that,
        and return when its entry fires next."""
        raise NotImplementedError


class FunctionCall(Call):
    """A ``Call`` that runs ``fn(told)``, *told* taking the next fire time."""

    __slots__ = ("fn",)

    def __init__(
        self, fn: Callable[[Callable[[datetime | None], None]], None], at: datetime | None = None
    ) -> None:
        super().__init__(at)
        self.fn = fn

    def run(self, done: Done) -> None:
        self.fn(functools.partial(done, self))

    def reject(self, stats: PoolStats) -> datetime | None:
        return self.entry.next_fire_time if self.entry is not None else None


#: What the dispatcher says of each firing: when its entry fires next (``None``: never again),
#: or a ``Call`` to run.
Outcome = datetime | None | Call


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
    failures: int = 0  # dispatch errors in a row

    def __lt__(self, other: Entry) -> bool:
        return self.name < other.name


class Dispatcher(Protocol):
    """What the scheduler asks of the code that fires entries (the firing pipeline)."""

    def first_fire_time(self, entry: Entry, *, now: datetime) -> datetime | None: ...

    def dispatch(self, items: list[tuple[Entry, Firing]]) -> list[Outcome]:
        """Decide and claim the firings *items* together, and say what becomes of each; never
        raise."""

    def rejected(self, entry: Entry, firing: Firing, stats: PoolStats) -> datetime | None:
        """Note a firing that found no room in the pool, before it was claimed, and return
        when its entry fires next; called on the dispatcher thread: no I/O."""

    def drain(self, timeout: float | None) -> bool:
        """Wait until the ends of the calls that ran are recorded."""
