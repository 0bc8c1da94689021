"""Keep a running task's lock alive: extend it on the scheduler's timer thread until the task
ends, so that a run longer than ``lock_at_most_for`` is not started again elsewhere."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from django.db import close_old_connections

from .clock import utcnow
from .locking import Lock, LockError
from .scheduler import Timer

__all__ = ["KeptAliveLock", "KEEP_ALIVE_MINIMUM"]

logger = logging.getLogger(__name__)

#: A lock is extended when half of ``lock_at_most_for`` has passed, but not more often than this.
KEEP_ALIVE_MINIMUM = timedelta(milliseconds=200)


class KeptAliveLock:
    """The lock of a running task, extended by the timer thread until the task ends."""

    def __init__(self, lock: Lock, timer: Timer | None, name: str) -> None:
        self.lock: Lock | None = lock
        self.name = name
        self._timer = timer
        self._mutex = threading.Lock()
        self._handle: int | None = None
        # Measured on this host's clock, like every later comparison here.
        self._least_until = utcnow() + lock.config.lock_at_least_for
        self._schedule()

    def _interval(self) -> float:
        assert self.lock is not None
        half = self.lock.config.lock_at_most_for / 2
        return max(half, KEEP_ALIVE_MINIMUM).total_seconds()

    def _schedule(self) -> None:
        if self._timer is not None and self.lock is not None:
            self._handle = self._timer.call_at(time.monotonic() + self._interval(), self._extend)

    def _extend(self) -> None:
        with self._mutex:
            if self.lock is None:
                return
            config = self.lock.config
            least = max(self._least_until - utcnow(), timedelta(0))
            try:
                close_old_connections()
                extended = self.lock.extend(
                    config.lock_at_most_for, min(least, config.lock_at_most_for)
                )
            except LockError:
                logger.warning("Could not extend the lock of %s; trying again", self.name)
                self._schedule()
                return
            if extended is None:
                logger.error(
                    "The lock of %s expired while it ran; another instance may start it. "
                    "Raise lock_at_most_for.",
                    self.name,
                )
                self.lock = None
                return
            self.lock = extended
            self._schedule()

    def release(self) -> None:
        with self._mutex:
            if self._handle is not None and self._timer is not None:
                self._timer.cancel(self._handle)
            lock, self.lock = self.lock, None
        if lock is not None:
            try:
                lock.unlock()
            except LockError:
                logger.warning(
                    "Could not release the lock of %s; it frees itself after lock_at_most_for",
                    self.name,
                )
