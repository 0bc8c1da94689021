"""Record the ends of runs and release their locks in batches, on a thread of its own.

A run ends on a worker thread, which hands its end here and moves on to the next task. This
thread takes every end waiting, and writes them in one transaction: the history rows (those
without an error in one statement per status), the task rows that need it (a fixed-delay task's
finish, a run that overran its next fire time, a run without a claim), and the release of their
locks. The order matters: a lock is released only once its run's end is stored, so the next
holder sees it. Should that transaction fail, each write is made on its own, and a database
error keeps it in the outbox: the runs happened.

While the scheduler starts a burst of firings, this thread waits a moment before it writes
(``bursts``): the ends can be recorded a few milliseconds later, the starts cannot.

Without its thread (``start()`` not called, or after ``stop()``), each end is written on the
thread that hands it in.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from django.db import DatabaseError, connections, transaction

from ..bursts import bursts
from ..locking import BaseLockProvider, Lock, LockError
from ..locking.base import named_handles
from ..storage import history
from ..storage.connections import KeptConnection
from ..storage.errors import is_conflict
from .outbox import Outbox

__all__ = ["EndWriter", "Ending", "Finished"]

logger = logging.getLogger(__name__)

#: Once an end is waiting, the thread waits this long for more to write with it (fewer, larger
#: commits in a burst), unless this many are waiting already.
GATHER_FOR = 0.005
GATHER_UP_TO = 500


class Ending(Protocol):
    """A run that ended, as the writer takes it: its history end (``None`` with the history
    off), the write of its task row if it needs one, and its lock (none when it was lost
    while it ran, or it had none): its own handle (``lock``), or the handle it was taken
    with, to release it by its name (``batch_lock``, see ``BatchLocks``). ``written(lost)``
    is called once all that is written, *lost* telling whether the release found the lock
    taken by another holder."""

    @property
    def name(self) -> str: ...

    @property
    def end(self) -> history.Ended | None: ...

    @property
    def row_write(self) -> Callable[[], None] | None: ...

    @property
    def lock(self) -> Lock | None: ...

    @property
    def batch_lock(self) -> Lock | None: ...

    def written(self, lost: bool) -> None: ...


@dataclass(slots=True)
class Finished:
    """An ``Ending`` that calls ``done(lost)`` once it is written."""

    name: str
    end: history.Ended | None
    row_write: Callable[[], None] | None
    lock: Lock | None
    done: Callable[[bool], None]
    batch_lock: Lock | None = None

    def written(self, lost: bool) -> None:
        self.done(lost)


class EndWriter:
    """Write the ends of runs in batches, then release their locks."""

    def __init__(
        self, *, using: str, provider: BaseLockProvider, outbox: Outbox, name: str
    ) -> None:
        self.using = using
        self.provider = provider
        self.outbox = outbox
        self.name = name
        self._connection = KeptConnection(using)
        self._items: list[Ending] = []
        self._cond = threading.Condition()
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._exited = True  # no thread takes items: add() writes on its caller's thread
        self._by_name: bool | None = None  # whether the provider releases locks by name

    def start(self) -> None:
        with self._cond:
            self._start()

    def _start(self) -> None:
        self._exited = False
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the writer thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def add(self, item: Ending) -> None:
        with self._cond:
            inline = self._exited
            if not inline:
                if self._thread is not None and not self._thread.is_alive():
                    # It died in spite of its guard (it never should): say so, and start
                    # another, rather than let the ends queue for ever.
                    logger.error("The writer thread %s has died; starting another", self.name)
                    self._start()
                self._items.append(item)
                if len(self._items) in (1, GATHER_UP_TO):  # the thread waits for these two
                    self._cond.notify_all()
        if inline:  # no thread (not started, or a shutdown that timed out): write it here
            self._write([item])

    def drain(self, timeout: float | None) -> bool:
        """Wait until every end handed in so far is written; return whether they all were."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._items and not self._busy, timeout)

    def stop(self, timeout: float | None = None) -> None:
        """Write what is waiting and end the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._items or self._stopped)
                if not self._items:
                    self._exited = True  # from here on, add() writes on its caller's thread
                    connections.close_all()  # this thread's own, kept open until now
                    return
                if not self._stopped:
                    self._cond.wait_for(
                        lambda: len(self._items) >= GATHER_UP_TO or self._stopped, GATHER_FOR
                    )
                items, self._items = self._items, []
                self._busy = True
                stopping = self._stopped
            try:
                if not stopping:
                    bursts.wait()  # the workers first, while they start a burst
                self._write(items)
            except BaseException:
                # Nothing that a write or a call back raises may end this thread: the ends
                # that come later would wait for ever.
                logger.exception("Recording the ends of %d run(s) failed", len(items))
            finally:
                # Not kept while the thread waits: a burst's ends, and the locks and callbacks
                # they hold, would stay in memory until the next one.
                del items
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, items: list[Ending]) -> None:
        lost: set[str] | None = None
        try:
            with self._connection.use():
                lost = self._write_all(items)
        finally:
            # Whatever failed above, each run is finished here: its task is scheduled again.
            self._finish(items, lost or set())

    def _write_all(self, items: list[Ending]) -> set[str]:
        ends = [item.end for item in items if item.end is not None]
        locks = [item.lock for item in items if item.lock is not None]
        by_name: dict[Lock, list[str]] = {}
        for item in items:
            if item.batch_lock is not None:
                by_name.setdefault(item.batch_lock, []).append(item.name)
        rows = [item.row_write for item in items if item.row_write is not None]
        for _ in range(2):  # once more after a deadlock with another instance
            together = self._write_together(ends, rows, locks, by_name)
            if together is not None:
                return together
        # One by one, so that each write that fails waits on its own.
        self._write_ends(ends)
        for item in items:
            if item.row_write is not None:
                self._keep_trying(f"the end of {item.name}'s run in its row", item.row_write)
        return self.release(locks, by_name)

    def _finish(self, items: list[Ending], lost: set[str]) -> None:
        for item in items:
            try:
                item.written(item.name in lost)
            except BaseException:
                logger.exception("Finishing the run of %s failed", item.name)

    def _write_together(
        self,
        ends: list[history.Ended],
        rows: list[Callable[[], None]],
        locks: list[Lock],
        by_name: dict[Lock, list[str]],
    ) -> set[str] | None:
        """Record *ends*, make the row writes *rows* and release *locks* (and those of
        *by_name*) in one commit (the locks after it, for a provider that cannot release them
        in it); return the names of the locks found lost, or ``None`` if it failed (nothing
        was written)."""
        joined = self.provider.supports_batches
        try:
            with transaction.atomic(using=self.using):
                # The lock rows first, as a batch's claims take them: transactions that take
                # the same rows in the same order deadlock less.
                lost = set()
                if (locks or by_name) and joined:
                    lost = self._unlock(locks, by_name, joined=True)
                if ends:
                    history.record_ends(using=self.using, ends=ends)
                for write in rows:
                    write()
        except (DatabaseError, LockError) as exc:
            # Rolled back: nothing was written, and the lock handles are still good.
            level = logging.INFO if is_conflict(exc) else logging.WARNING
            logger.log(level, "Recording %d run end(s) in one commit failed: %s", len(ends), exc)
            return None
        return lost if joined else self.release(locks, by_name)

    def _write_ends(self, ends: list[history.Ended]) -> None:
        if not ends:
            return
        try:
            history.record_ends(using=self.using, ends=ends)
        except DatabaseError as exc:
            logger.error(
                "%d run(s) ended but could not be recorded: the database is unavailable (%s). "
                "Recording them when the database is back.",
                len(ends),
                exc,
            )
            for end in ends:
                self.outbox.add(
                    f"the end of run {end.run_id}",
                    functools.partial(history.record_ends, using=self.using, ends=[end]),
                )

    def _keep_trying(self, what: str, write: Callable[[], None]) -> None:
        try:
            write()
        except DatabaseError as exc:
            logger.error("Could not record %s yet (%s); trying again later", what, exc)
            self.outbox.add(what, write)

    def _unlock(
        self, locks: list[Lock], by_name: dict[Lock, list[str]], *, joined: bool = False
    ) -> set[str]:
        if not by_name:
            return set(self.provider.unlock_many(locks, joined=joined))
        if self._takes_names():
            return set(self.provider.unlock_many(locks, joined=joined, by_name=by_name))
        # An override of unlock_many written before it took names: a handle for each.
        return set(self.provider.unlock_many([*locks, *named_handles(by_name)], joined=joined))

    def _takes_names(self) -> bool:
        """Return whether the provider's ``unlock_many`` takes ``by_name=``."""
        if self._by_name is None:
            parameters = inspect.signature(self.provider.unlock_many).parameters
            self._by_name = "by_name" in parameters or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
            )
        return self._by_name

    def release(self, locks: list[Lock], by_name: dict[Lock, list[str]] | None = None) -> set[str]:
        """Release *locks*, and the locks named in *by_name* under the handle each was taken
        with, now, on the caller's thread; return the names of those found lost. A database
        error keeps the releases not made yet in the outbox."""
        by_name = by_name or {}
        if not locks and not by_name:
            return set()
        try:
            return self._unlock(locks, by_name)
        except LockError as exc:
            # Release them when the database answers again, rather than leave them held, by
            # this very instance, until lock_at_most_for. A handle released before the
            # failure is spent; a name says so through the error.
            named = named_handles(by_name, skip=exc.released)
            left = [lock for lock in [*locks, *named] if lock.valid]
            logger.warning("Could not release %d lock(s); trying again later", len(left))
            for lock in left:
                self.outbox.add(f"the release of the lock of {lock.config.name}", lock.unlock)
            return set()
