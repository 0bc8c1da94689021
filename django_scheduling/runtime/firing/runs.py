"""A firing on its way through the pipeline: a ``Claim`` from its decision to its claim, then a
``ClaimedRun`` from its claim to the record of its end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from ...schedules.decisions import Firing, Run, TaskRow
from ..calls import Call, Done
from ..keepalive import BatchLocks
from ..pool import PoolStats
from .spec import TaskSpec

if TYPE_CHECKING:
    from ...locking import Lock
    from ...storage.history import Ended

__all__ = ["Claim", "ClaimedRun", "Handler", "Handed"]

_NO_TIME = timedelta(0)


@dataclass(slots=True, eq=False)
class Claim:
    """A firing decided to run (or, with *serve*, a paused task's fire time to mark as served
    without a run), on its way through the claim."""

    index: int  # its place in the batch
    spec: TaskSpec
    firing: Firing
    decision: Run | None
    row: TaskRow | None
    #: A paused locked task's fire time, claimed without a run.
    serve: datetime | None = None
    #: The firing was claimed ahead of its time: it starts then.
    at: datetime | None = None
    lock: Lock | None = None
    run_id: int | None = None
    #: The run is this instance's: its fire time claimed, its request taken, or (``lock=False``)
    #: nothing to take.
    taken: bool = False
    #: The claim moved the row's last fire time to this firing's (a locked task's schedule).
    claimed: bool = False
    #: The claim wrote the run and the next fire time it plans (``planned``) in the row: a
    #: claimed fire time, or a scheduled run of a task with ``lock=False``.
    noted: bool = False
    planned: datetime | None = None
    #: The last fire time the row holds once the run is taken (the fence of its end).
    seen: datetime | None = None
    #: What the enqueue made in the claim's transaction (an engine that commits with it).
    handed: Handed | None = None

    @property
    def fire_time(self) -> datetime | None:
        return self.decision.fire_time if self.decision is not None else self.serve


@dataclass(frozen=True, slots=True)
class Handed:
    """What became of one enqueue: the run's status, when it ended, the backend, the result
    id, and the error (type, message, traceback) and exception of a failed one."""

    status: str
    finished: datetime
    backend: str
    result_id: str
    error: tuple[str, str, str]
    exc: BaseException | None = None


class Handler(Protocol):
    """What runs a claimed firing (calls the task, or enqueues it), and what is told once its
    end is recorded."""

    def run(self, run: ClaimedRun, done: Done) -> None: ...

    def written(self, run: ClaimedRun, lost: bool) -> None: ...

    def reject(self, run: ClaimedRun, stats: PoolStats) -> datetime | None: ...


class ClaimedRun(Call):
    """A firing claimed for this process, from its claim to the record of its end: ``run(done)``
    hands it over (on a worker thread), and its end to the writer, which calls ``written()``
    with whether the lock was lost. One object all along: a burst claimed ahead keeps
    thousands at once. Its lock stays with the batch's (``locks``, at ``slot``), kept alive
    together, until the run ends."""

    __slots__ = (
        "batch_lock",
        "claimed",
        "done",
        "duration",
        "end",
        "exc",
        "fenced",
        "fire_time",
        "handed",
        "handler",
        "lock",
        "lock_lost",
        "locks",
        "next_time",
        "noted",
        "planned",
        "recorded",
        "recovery_of",
        "row_write",
        "run_after",
        "run_id",
        "seen",
        "slot",
        "spec",
    )

    def __init__(
        self,
        handler: Handler,
        claim: Claim,
        locks: BatchLocks | None,
        slot: int,
        *,
        ahead: bool = False,
    ) -> None:
        # Claimed ahead of its time, it starts then; or, *ahead*, it is handed over at once,
        # and its engine holds it until then (``run_after``).
        super().__init__(None if ahead else claim.at)
        self.run_after = claim.at if ahead else None
        self.handler = handler
        self.spec: TaskSpec = claim.spec
        self.fire_time = claim.fire_time
        self.run_id = claim.run_id
        self.claimed, self.noted = claim.claimed, claim.noted
        self.planned, self.seen = claim.planned, claim.seen
        request = claim.decision.request if claim.decision is not None else None
        self.recovery_of = request.recover_run_id if request is not None else None
        self.handed = claim.handed
        #: The claim's transaction recorded its end (an enqueue that commits with it).
        self.recorded = claim.handed is not None
        self.locks = locks if claim.lock is not None else None
        self.slot = slot
        # Set when the run has ended, for the writer (see ``writer.Ending``) and its call
        # back:
        self.end: Ended | None = None
        self.row_write: Callable[[], None] | None = None
        self.lock: Lock | None = None
        self.batch_lock: Lock | None = None
        self.done: Done | None = None
        self.next_time: datetime | None = None
        self.duration = _NO_TIME
        self.exc: BaseException | None = None
        #: An extension found its lock lost while it ran.
        self.lock_lost = False
        #: The write of its end in the task row found a newer claim there.
        self.fenced = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def locked_at(self) -> datetime | None:
        locks = self.locks
        return locks.locked_at(self.slot) if locks is not None else None

    @property
    def lost(self) -> bool:
        """Whether an extension has found its lock lost while it runs."""
        locks = self.locks
        return self.lock_lost or (locks is not None and locks.lost(self.slot))

    def detach_lock(self) -> None:
        """Stop keeping its lock alive, and keep what the writer releases (``lock``, or
        ``batch_lock`` for a lock released by its name)."""
        locks = self.locks
        if locks is not None:
            self.locks = None
            self.lock, self.batch_lock, lost = locks.detach(self.slot)
            self.lock_lost = self.lock_lost or lost

    def release_lock(self) -> None:
        """Release its lock now (a shutdown); a lock found lost is reported when the run
        ends."""
        locks = self.locks
        if locks is not None:
            self.locks = None
            if not locks.release(self.slot):
                self.lock_lost = True

    def run(self, done: Done) -> None:
        self.handler.run(self, done)

    def reject(self, stats: PoolStats) -> datetime | None:
        return self.handler.reject(self, stats)

    def written(self, lost: bool) -> None:
        self.handler.written(self, lost)


def unset_outcomes(count: int) -> list[Any]:
    """Return the outcomes of a batch of *count* firings before anything is decided."""
    return [UNSET] * count


#: An outcome not decided yet.
UNSET: Any = object()
