"""Record the ends of runs and release their locks in batches, on a thread of its own.

A run that the claims of a batch started (see ``execution.TaskRunner.run_batch``) ends on a
worker thread, which hands its end here and moves on to the next task. This thread takes every
end waiting, and writes them in a few statements: the history rows of the successes in one,
each failure in one, the task rows that need it one by one (a fixed-delay task's finish, a run
that overran its next fire time), then releases all their locks in one. The order matters: a
lock is released only once its run's end is stored, so the next holder sees it. A database
error keeps the writes in the outbox, as for a single firing: the runs happened.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, connections, transaction

from .locking import Lock, LockError
from .outbox import Outbox
from .storage import history
from .storage.connections import KeptConnection
from .storage.errors import is_conflict

__all__ = ["EndWriter", "Finished"]

logger = logging.getLogger(__name__)

#: Once an end is waiting, the thread waits this long for more to write with it (fewer, larger
#: commits in a burst), unless this many are waiting already.
GATHER_FOR = 0.005
GATHER_UP_TO = 500


@dataclass(slots=True)
class Finished:
    """A run that ended: its history end (``None`` with the history off), the write of its
    task row if it needs one, its lock (``None`` when it was lost while it ran), and what to
    do once all that is written: ``done(lost)``, *lost* telling whether the release found
    the lock taken by another holder."""

    name: str
    end: history.Ended | None
    row_write: Callable[[], None] | None
    lock: Lock | None
    done: Callable[[bool], None]


class EndWriter:
    """Write the ends of runs in batches, then release their locks."""

    def __init__(self, *, using: str, provider: object, outbox: Outbox, name: str) -> None:
        self.using = using
        self.provider = provider
        self.outbox = outbox
        self._connection = KeptConnection(using)
        self._items: list[Finished] = []
        self._cond = threading.Condition()
        self._busy = False
        self._stopped = False
        self._exited = False  # the thread has taken its last items
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the writer thread runs."""
        return self._thread.is_alive()

    def add(self, item: Finished) -> None:
        with self._cond:
            if self._exited:
                stopped = True
            else:
                stopped = False
                self._items.append(item)
                if len(self._items) in (1, GATHER_UP_TO):  # the thread waits for these two
                    self._cond.notify_all()
        if stopped:  # after the thread ended (a shutdown that timed out): write it here
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
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

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
            try:
                self._write(items)
            except Exception:
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
        if not any(item.row_write for item in items):
            for _ in range(2):  # once more after a deadlock with another instance
                together = self._write_together(ends, locks)
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
            except Exception:
                logger.exception("Finishing the run of %s failed", item.name)

    def _write_together(self, ends: list[history.Ended], locks: list[Lock]) -> set[str] | None:
        """Record *ends* and release *locks* in one commit; return the names of the locks
        found lost, or ``None`` if it failed (nothing was written)."""
        unlock_many = getattr(self.provider, "unlock_many", None)
        if unlock_many is None:
            return None
        try:
            with transaction.atomic(using=self.using):
                # The lock rows first, as a batch's claims take them: transactions that take
                # the same rows in the same order deadlock less.
                lost = set(unlock_many(locks, joined=True)) if locks else set()
                if ends:
                    history.record_ends(using=self.using, ends=ends)
                return lost
        except (DatabaseError, LockError) as exc:
            # Rolled back: nothing was written, and the lock handles are still good.
            level = logging.INFO if is_conflict(exc) else logging.WARNING
            logger.log(level, "Recording %d run end(s) in one commit failed: %s", len(ends), exc)
            return None

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
        unlock_many = getattr(self.provider, "unlock_many", None)
        try:
            if unlock_many is not None:
                return set(unlock_many(locks))
            return {lock.config.name for lock in locks if lock.unlock() is False}
        except LockError:
            # Release them when the database answers again, rather than leave them held, by
            # this very instance, until lock_at_most_for.
            logger.warning("Could not release %d lock(s); trying again later", len(locks))
            for lock in locks:
                if lock.valid:
                    self.outbox.add(f"the release of the lock of {lock.config.name}", lock.unlock)
            return set()
