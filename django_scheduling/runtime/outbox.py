"""Writes that could not be made when they happened, kept until the database takes them.

A run that finishes while the database is unreachable still ran: its outcome waits here and is
written when the database answers again. A rejected firing is written here too, so that the
dispatcher thread, which rejects it, never touches the database.

Only a transient failure (the connection is gone, the server is busy, a table is missing until
``migrate``, a deadlock) keeps a write waiting, and the writes behind it. A write that fails for
good (a constraint, a value the column refuses, a bug) is logged at ERROR and set aside: counted,
never tried again, and never holding up the others. Nothing is dropped for want of room: the
firings back off while the database is away, so what waits here is what was under way when it
went. Its length and the writes set aside are in the health report and the metrics.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from django.db import InterfaceError, InternalError, OperationalError

from ..locking.base import LockError
from ..storage.errors import is_conflict, missing_table

__all__ = ["Outbox", "LONG_AFTER", "transient"]

logger = logging.getLogger(__name__)

#: A WARNING says so when the outbox grows past this many writes, and again at each doubling.
LONG_AFTER = 10_000


@dataclass(frozen=True, slots=True)
class _Write:
    description: str
    write: Callable[[], object]


def transient(exc: BaseException) -> bool:
    """Return whether *exc*, raised by a write, may pass: the write is tried again later."""
    if isinstance(exc, LockError):
        if exc.__cause__ is None:
            return True  # the lock storage failed, and says no more
        exc = exc.__cause__
    if isinstance(exc, OperationalError | InterfaceError | InternalError):
        return True
    return is_conflict(exc) or missing_table(exc)


class Outbox:
    """A queue of pending writes, emptied in order by ``flush()``."""

    def __init__(self) -> None:
        self._writes: deque[_Write] = deque()
        self._mutex = threading.Lock()
        self._flushing = threading.Lock()
        self._warn_at = LONG_AFTER
        #: Writes that failed for good, set aside (see ``flush()``).
        self.set_aside = 0

    def __len__(self) -> int:
        with self._mutex:
            return len(self._writes)

    def add(self, description: str, write: Callable[[], object]) -> None:
        """Keep *write* (a callable making database statements) until ``flush()`` makes it."""
        with self._mutex:
            self._writes.append(_Write(description, write))
            length = len(self._writes)
            warn = length >= self._warn_at
            if warn:
                self._warn_at *= 2
        if warn:
            logger.warning(
                "%d writes wait for the database (the latest: %s); none is dropped",
                length,
                description,
            )

    def flush(self) -> int:
        """Make the pending writes in order, and return how many were made. A transient
        failure stops the flush (the database is still away); a write that fails for good is
        set aside, and the flush goes on.

        One flush runs at a time: a call while another runs returns 0 at once.
        """
        if not self._flushing.acquire(blocking=False):
            return 0
        try:
            return self._flush()
        finally:
            self._flushing.release()

    def _flush(self) -> int:
        done = 0
        while True:
            with self._mutex:
                if not self._writes:
                    if self._warn_at > LONG_AFTER:
                        self._warn_at = LONG_AFTER
                    return done
                item = self._writes[0]
            try:
                item.write()
            except Exception as exc:
                if transient(exc):
                    logger.warning("Could not write %s yet: %s", item.description, exc)
                    return done
                logger.error(
                    "Could not write %s, and trying again would not help: %s. It is set aside.",
                    item.description,
                    exc,
                    exc_info=exc,
                )
                with self._mutex:
                    self.set_aside += 1
                    self._pop(item)
                continue
            with self._mutex:
                self._pop(item)
            done += 1
            logger.info("Wrote %s, which had waited for the database", item.description)

    def _pop(self, item: _Write) -> None:
        if self._writes and self._writes[0] is item:
            self._writes.popleft()
