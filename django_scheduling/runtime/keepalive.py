"""Keep running tasks' locks alive, on a thread that does nothing else.

A lock is extended when half of its ``lock_at_most_for`` has passed, so that a run longer than
that is not started again elsewhere. The thread runs only the extension statements: no poll,
no history write and no housekeeping can delay an extension until the lock expires.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from django.db import close_old_connections, connections

from ..clock import utcnow
from ..locking import Lock, LockError

__all__ = ["BatchLocks", "KeepAlive", "KeptAliveLock", "KEEP_ALIVE_MINIMUM"]

logger = logging.getLogger(__name__)

#: A lock is extended when half of ``lock_at_most_for`` has passed, but not more often than this.
KEEP_ALIVE_MINIMUM = timedelta(milliseconds=200)
#: After a failed extension (database unreachable), the next try comes this much later.
RETRY_AFTER = timedelta(milliseconds=500)


class KeptAliveLock:
    """The lock of a running task, extended by a ``KeepAlive`` thread until ``release()``.

    ``lost`` turns true when an extension or the release finds that the lock is no longer this
    run's: it expired, or another instance took it over. The run may then have overlapped with
    a run elsewhere.
    """

    __slots__ = ("_keeper", "_least_until", "_mutex", "due", "lock", "lost", "name", "unreleased")

    def __init__(
        self, lock: Lock, name: str, keeper: KeepAlive | None, since: datetime | None = None
    ) -> None:
        self.lock: Lock | None = lock
        self.name = name
        self.lost = False
        #: A lock whose unlock failed (database unreachable), to unlock again later.
        self.unreleased: Lock | None = None
        self._keeper = keeper
        # One each, not shared: an extension holds it across a database round trip, which
        # must not hold up the release of another task's lock.
        self._mutex = threading.Lock()
        # Measured on this host's clock (from *since*, when the lock was taken earlier), like
        # every later comparison here; None: no minimum.
        least = lock.config.lock_at_least_for
        self._least_until = (since or utcnow()) + least if least else None
        self.due = _next_due(_interval(lock), keeper)
        if keeper is not None:
            keeper._add(self)

    def extend(self) -> None:
        """Extend the lock now (the keep-alive thread calls this when it is due)."""
        with self._mutex:
            lock = self.lock
            if lock is None:
                return
            config = lock.config
            least = timedelta(0)
            if self._least_until is not None:
                least = max(self._least_until - utcnow(), least)
            try:
                close_old_connections()
                extended = lock.extend(config.lock_at_most_for, min(least, config.lock_at_most_for))
            except LockError as exc:
                logger.warning("Could not extend the lock of %s (%s); trying again", self.name, exc)
                self.due = time.monotonic() + RETRY_AFTER.total_seconds()
                return
            if extended is None:
                logger.error(
                    "The lock of %s expired while it ran; another instance may run it at the "
                    "same time. Raise lock_at_most_for, or look for a process that was frozen.",
                    self.name,
                )
                self.lock, self.lost = None, True
                return
            self.lock = extended
            self.due = _next_due(_interval(extended), self._keeper)

    def detach(self) -> Lock | None:
        """Stop extending and return the lock, to be released by the caller; ``None`` when it
        was found lost meanwhile."""
        with self._mutex:
            if self._keeper is not None:
                self._keeper._remove(self)
            lock, self.lock = self.lock, None
        return lock

    def release(self) -> bool:
        """Stop extending and unlock; return False when the lock was no longer this run's."""
        with self._mutex:
            if self._keeper is not None:
                self._keeper._remove(self)
            lock, self.lock = self.lock, None
        if lock is None:
            return not self.lost
        try:
            released = lock.unlock()
        except LockError:
            logger.warning("Could not release the lock of %s; trying again later", self.name)
            self.unreleased = lock  # the handle stays usable after a storage error
            return True  # unknown, not lost: nothing says another instance has it
        if released is False:
            self.lost = True
        return not self.lost


def _interval(lock: Lock) -> float:
    """Return how often *lock* is extended, in seconds."""
    return max(lock.config.lock_at_most_for / 2, KEEP_ALIVE_MINIMUM).total_seconds()


def _next_due(interval: float, keeper: KeepAlive | None) -> float:
    """Return when to extend next, *interval* seconds from now: rounded up to a hundredth of a
    second, and the same object for the locks taken together (a burst claimed ahead holds
    thousands)."""
    due = math.ceil((time.monotonic() + interval) * 100) / 100
    if keeper is None:
        return due
    if keeper._last_due == due:
        return keeper._last_due
    keeper._last_due = due
    return due


class BatchLocks:
    """The locks of firings claimed together, kept alive by one record until each run ends
    (a burst claimed ahead of its instant, or runs queued behind others), instead of a
    ``KeptAliveLock`` each.

    ``detach(index)`` takes the lock at *index* out when its run ends, for the caller to
    release. If the locks come due for an extension first (a run, or a wait, longer than half
    of ``lock_at_most_for``), each one still in the batch gets its own ``KeptAliveLock`` at
    once, extended then.

    Handles that share all but their lock's name (see ``Lock._shared()``: the database
    provider's, taken in one statement) are kept as one handle and each lock's name, and such
    a lock is released by its name through that handle: a burst of 10,000 firings holds
    10,000 names, not 10,000 handles, configurations and keep-alive records with their
    mutexes (about 300 bytes each).
    """

    __slots__ = (
        "_groups",
        "_keeper",
        "_left",
        "_locks",
        "_mutex",
        "_shared",
        "_since",
        "due",
        "name",
    )

    def __init__(
        self, locks: list[Lock], keeper: KeepAlive | None, since: datetime | None = None
    ) -> None:
        #: Each lock: its own handle, or its name (its handle is ``_shared`` at the index in
        #: ``_groups``), while this record keeps it alive; its ``KeptAliveLock`` once it is
        #: kept alive on its own; ``None`` once detached.
        self._locks: list[Lock | str | KeptAliveLock | None] = []
        self._groups: list[int] = []
        self._shared: list[Lock] = []
        keys: dict[Any, int] = {}
        for lock in locks:
            key = lock._shared() if isinstance(lock, Lock) else None
            group = -1
            if key is not None:
                group = keys.get(key, -1)
                if group < 0:
                    group = keys[key] = len(self._shared)
                    self._shared.append(lock)
            self._locks.append(lock if group < 0 else lock.config.name)
            self._groups.append(group)
        self._left = len(locks)  # kept alive by this record
        self._keeper = keeper
        self._mutex = threading.Lock()
        # When they were taken, on this host's clock: lock_at_least_for counts from then.
        self._since = since or utcnow()
        self.name = f"{len(locks)} firings claimed together"
        self.due = _next_due(min(map(_interval, locks), default=0.0), keeper)
        if keeper is not None and locks:
            keeper._add(self)

    def locked_at(self, index: int) -> datetime | None:
        """Return when the lock at *index* was taken, or last extended (``None``: detached,
        or found lost)."""
        lock = self._locks[index]
        if isinstance(lock, KeptAliveLock):
            lock = lock.lock
        elif isinstance(lock, str):
            lock = self._shared[self._groups[index]]
        return lock.locked_at if lock is not None else None

    def lost(self, index: int) -> bool:
        """Return whether an extension found the lock at *index* lost: it expired, or another
        instance took it over."""
        lock = self._locks[index]
        return isinstance(lock, KeptAliveLock) and lock.lost

    def detach(self, index: int) -> tuple[Lock | None, Lock | None, bool]:
        """Stop keeping the lock at *index* alive and return it for the caller to release:
        ``(handle, None, lost)``, or ``(None, shared, lost)`` for a lock to release by its
        name through the handle *shared*. There is none to release when an extension found
        it *lost*, or it was detached already."""
        with self._mutex:
            lock = self._locks[index]
            self._locks[index] = None
            if lock is not None and not isinstance(lock, KeptAliveLock):
                self._gone()
        if isinstance(lock, KeptAliveLock):
            return lock.detach(), None, lock.lost
        if isinstance(lock, str):
            return None, self._shared[self._groups[index]], False
        return lock, None, False

    def release(self, index: int) -> bool:
        """Release the lock at *index* now; return False when it was no longer this run's."""
        with self._mutex:
            held = self._own(index)
        return held.release() if held is not None else True

    def extend(self) -> None:
        """Give each lock still kept by this record its own ``KeptAliveLock``, and extend it
        now."""
        kept = []
        with self._mutex:
            for index, lock in enumerate(self._locks):
                if lock is not None and not isinstance(lock, KeptAliveLock):
                    kept.append(self._own(index))
        for held in kept:
            if held is not None:
                held.extend()

    def _own(self, index: int) -> KeptAliveLock | None:
        """Give the lock at *index* its own ``KeptAliveLock`` (with the mutex held)."""
        lock = self._locks[index]
        if lock is None or isinstance(lock, KeptAliveLock):
            return lock
        if isinstance(lock, str):
            lock = self._shared[self._groups[index]]._named(lock)
        held = self._locks[index] = KeptAliveLock(
            lock, lock.config.name, self._keeper, since=self._since
        )
        self._gone()
        return held

    def _gone(self) -> None:
        """One lock fewer kept alive by this record (with the mutex held)."""
        self._left -= 1
        if not self._left and self._keeper is not None:
            self._keeper._remove(self)


class KeepAlive:
    """A thread that extends the locks of running tasks when they are due, and nothing else."""

    def __init__(self, name: str = "scheduling-keepalive") -> None:
        self._held: set[KeptAliveLock | BatchLocks] = set()
        self._cond = threading.Condition()
        self._stopped = False
        self._wake_at: float | None = None  # when the thread wakes next (None: when told)
        self._last_due = 0.0  # the last extension time given out, shared by equal ones
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    @property
    def alive(self) -> bool:
        """Whether the keep-alive thread runs."""
        return self._thread.is_alive()

    def hold(self, lock: Lock, name: str) -> KeptAliveLock:
        """Return *lock* kept alive until its ``release()``."""
        return KeptAliveLock(lock, name, self)

    def __len__(self) -> int:
        with self._cond:
            return len(self._held)

    def _add(self, held: KeptAliveLock | BatchLocks) -> None:
        with self._cond:
            self._held.add(held)
            # Wake the thread only when this lock is due before it would wake anyway: a burst
            # of a thousand runs must not make it scan every lock a thousand times.
            if self._wake_at is None or held.due < self._wake_at:
                self._wake_at = held.due
                self._cond.notify()

    def _remove(self, held: KeptAliveLock | BatchLocks) -> None:
        with self._cond:
            self._held.discard(held)
            if not self._held:
                self._held.clear()  # frees the table a burst grew (a discard never shrinks it)

    def _loop(self) -> None:
        try:
            self._extend_when_due()
        finally:
            # The thread's own connections: a process that goes on after a stop (a service
            # started again, a test runner) must not keep its sessions open.
            connections.close_all()

    def _extend_when_due(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    now = time.monotonic()
                    # As many entries as tasks running at once: a scan beats a heap whose
                    # released entries would linger until their time came.
                    due = [held for held in self._held if held.due <= now]
                    if due:
                        break
                    earliest = min((held.due for held in self._held), default=None)
                    self._wake_at = earliest
                    self._cond.wait(None if earliest is None else earliest - now)
                if self._stopped:
                    return
            for held in due:
                try:
                    held.extend()
                except Exception:
                    logger.exception("Extending the lock of %s failed", held.name)
                    held.due = time.monotonic() + RETRY_AFTER.total_seconds()
