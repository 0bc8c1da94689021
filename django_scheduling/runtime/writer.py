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
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, connections, transaction

from ..bursts import bursts
from ..locking import BaseLockProvider, Lock, LockError
from ..storage import history
from ..storage.connections import KeptConnection
from ..storage.errors import is_conflict
from .outbox import Outbox

__all__ = ["EndWriter", "Finished"]

logger = logging.getLogger(__name__)

#: Once an end is waiting, the thread waits this long for more to write with it (fewer, larger
#: commits in a burst), unless this many are waiting already.
GATHER_FOR = 0.005
GATHER_UP_TO = 500


@dataclass(slots=True)
class Finished:
    """A run that ended: its history end (``None`` with the history off), the write of its
    task row if it needs one, its lock (``None`` when it was lost while it ran, or it had
    none), and what to do once all that is written: ``done(lost)``, *lost* telling whether
    the release found the lock taken by another holder."""

    name: str
    end: history.Ended | None
    row_write: Callable[[], None] | None
    lock: Lock | None
    done: Callable[[bool], None]


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
        self._items: list[Finished] = []
        self._cond = threading.Condition()
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._exited = True  # no thread takes items: add() writes on its caller's thread

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

    def add(self, item: Finished) -> None:
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

    def _write(self, items: list[Finished]) -> None:
        lost: set[str] | None = None
        try:
            with self._connection.use():
                lost = self._write_all(items)
        finally:
            # Whatever failed above, each run is finished here: its task is scheduled again.
            self._finish(items, lost or set())

    def _write_all(self, items: list[Finished]) -> set[str]:
        ends = [item.end for item in items if item.end is not None]
        locks = [item.lock for item in items if item.lock is not None]
        rows = [item.row_write for item in items if item.row_write is not None]
        for _ in range(2):  # once more after a deadlock with another instance
            together = self._write_together(ends, rows, locks)
            if together is not None:
                return together
        # One by one, so that each write that fails waits on its own.
        self._write_ends(ends)
        for item in items:
            if item.row_write is not None:
                self._keep_trying(f"the end of {item.name}'s run in its row", item.row_write)
        return self.release(locks)

    def _finish(self, items: list[Finished], lost: set[str]) -> None:
        for item in items:
            try:
                item.done(item.name in lost)
            except BaseException:
                logger.exception("Finishing the run of %s failed", item.name)

    def _write_together(
        self, ends: list[history.Ended], rows: list[Callable[[], None]], locks: list[Lock]
    ) -> set[str] | None:
        """Record *ends*, make the row writes *rows* and release *locks* in one commit (the
        locks after it, for a provider that cannot release them in it); return the names of
        the locks found lost, or ``None`` if it failed (nothing was written)."""
        joined = self.provider.supports_batches
        try:
            with transaction.atomic(using=self.using):
                # The lock rows first, as a batch's claims take them: transactions that take
                # the same rows in the same order deadlock less.
                lost = set()
                if locks and joined:
                    lost = set(self.provider.unlock_many(locks, joined=True))
                if ends:
                    history.record_ends(using=self.using, ends=ends)
                for write in rows:
                    write()
        except (DatabaseError, LockError) as exc:
            # Rolled back: nothing was written, and the lock handles are still good.
            level = logging.INFO if is_conflict(exc) else logging.WARNING
            logger.log(level, "Recording %d run end(s) in one commit failed: %s", len(ends), exc)
            return None
        return lost if joined else self.release(locks)

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

    def release(self, locks: list[Lock]) -> set[str]:
        """Release *locks* now, on the caller's thread; return the names of those found lost.
        A database error keeps the releases in the outbox."""
        if not locks:
            return set()
        try:
            return set(self.provider.unlock_many(locks))
        except LockError:
            # Release them when the database answers again, rather than leave them held, by
            # this very instance, until lock_at_most_for.
            logger.warning("Could not release %d lock(s); trying again later", len(locks))
            for lock in locks:
                if lock.valid:
                    self.outbox.add(f"the release of the lock of {lock.config.name}", lock.unlock)
            return set()
