"""Writes that could not be made when they happened, kept until the database takes them.

A run that finishes while the database is unreachable still ran: its outcome waits here and
is written when the database answers again. A rejected firing is written here too, so that
the dispatcher thread, which rejects it, never touches the database.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError

from .locking.base import LockError

__all__ = ["Outbox", "OUTBOX_LIMIT"]

logger = logging.getLogger(__name__)

#: Writes kept at most; past this the oldest are dropped, with a warning.
OUTBOX_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class _Write:
    description: str
    write: Callable[[], object]


class Outbox:
    """A queue of pending writes, emptied in order by ``flush()``."""

    def __init__(self, limit: int = OUTBOX_LIMIT) -> None:
        self._writes: deque[_Write] = deque()
        self._mutex = threading.Lock()
        self._flushing = threading.Lock()
        self._limit = limit
        self.dropped = 0

    def __len__(self) -> int:
        with self._mutex:
            return len(self._writes)

    def add(self, description: str, write: Callable[[], object]) -> None:
        """Keep *write* (a callable making database statements) until ``flush()`` makes it."""
        with self._mutex:
            if len(self._writes) >= self._limit:
                dropped = self._writes.popleft()
                self.dropped += 1
                logger.warning("Dropped a pending write, the outbox is full: %s", dropped)
            self._writes.append(_Write(description, write))

    def flush(self) -> int:
        """Make the pending writes in order; stop at the first that the database refuses.

        Return how many were made. One flush runs at a time: a call while another runs returns
        0 at once.
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
                    return done
                item = self._writes[0]
            try:
                item.write()
            except (DatabaseError, LockError) as exc:
                logger.warning("Could not write %s yet: %s", item.description, exc)
                return done
            with self._mutex:
                if self._writes and self._writes[0] is item:
                    self._writes.popleft()
            done += 1
            logger.info("Wrote %s, which had waited for the database", item.description)
