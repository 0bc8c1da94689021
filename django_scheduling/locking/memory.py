"""A lock provider for one process: the lock table is a dict.

It suits a single instance, the tests, and ``SCHEDULING['LOCK_PROVIDER'] = "memory"``. It keeps
the database provider's rules: a free lock is one whose ``lock_until`` is not in the future,
``unlock()`` honours ``lock_at_least_for`` and only the handle's own acquisition can be released
or extended.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ..clock import utcnow
from ..conf import get_settings
from .base import BaseLockProvider, Lock, LockConfiguration

__all__ = ["InMemoryLockProvider"]

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]


@dataclass
class _Row:
    lock_until: datetime
    locked_at: datetime
    locked_by: str
    token: object  # one per acquisition; a handle may touch only the row of its own acquisition


class InMemoryLockProvider(BaseLockProvider):
    """Keep locks in this process; *clock* returns aware UTC now (tests pass a fake one)."""

    def __init__(self, owner: str | None = None, clock: Clock | None = None) -> None:
        self._owner = owner
        self.clock: Clock = clock or utcnow
        self._mutex = threading.Lock()
        self._rows: dict[str, _Row] = {}

    def __repr__(self) -> str:
        return f"<InMemoryLockProvider owner={self.owner!r}>"

    @property
    def owner(self) -> str:
        """Return the ``locked_by`` value: the given owner, else the instance name."""
        return self._owner or get_settings().instance_name

    def with_owner(self, owner: str) -> InMemoryLockProvider:
        """Return a provider on the same lock table under another owner, the way a second
        instance shares a database."""
        sibling = InMemoryLockProvider(owner, self.clock)
        sibling._mutex, sibling._rows = self._mutex, self._rows
        return sibling

    def lock(self, config: LockConfiguration) -> Lock | None:
        """Return a held lock for *config*, or ``None`` if it is held until later."""
        with self._mutex:
            now = self.clock()
            row = self._rows.get(config.name)
            if row is not None and row.lock_until > now:
                logger.debug(
                    "Lock %r is held by %s until %s", config.name, row.locked_by, row.lock_until
                )
                return None
            token = object()
            until = now + config.lock_at_most_for
            self._rows[config.name] = _Row(until, now, self.owner, token)
        logger.debug("Acquired lock %r until %s", config.name, until)
        return _MemoryLock(self, token, config, locked_at=now, lock_until=until)


class _MemoryLock(Lock):
    __slots__ = ("_provider", "_token")

    def __init__(
        self,
        provider: InMemoryLockProvider,
        token: object,
        config: LockConfiguration,
        **times: datetime,
    ) -> None:
        super().__init__(config, **times)
        self._provider = provider
        self._token = token

    def _own_row(self) -> _Row | None:
        row = self._provider._rows.get(self.config.name)
        return row if row is not None and row.token is self._token else None

    def _unlock(self) -> bool:
        with self._provider._mutex:
            if (row := self._own_row()) is not None:
                row.lock_until = max(self._provider.clock(), self._least_until)
                logger.debug("Unlocked %r; free from %s", self.config.name, row.lock_until)
                return True
            holder = self._provider._rows[self.config.name].locked_by
        logger.warning(
            "Lock %r was no longer held by this handle when it was released: it expired and "
            "was taken again by %s; holders may have overlapped",
            self.config.name,
            holder,
        )
        return False

    def _extend(self, config: LockConfiguration) -> Lock | None:
        with self._provider._mutex:
            now = self._provider.clock()
            row = self._own_row()
            if row is None or row.lock_until <= now:
                logger.debug("Could not extend lock %r: no longer held", config.name)
                return None
            row.lock_until = now + config.lock_at_most_for
            return _MemoryLock(
                self._provider,
                self._token,
                config,
                locked_at=self.locked_at,
                lock_until=row.lock_until,
                least_until=now + config.lock_at_least_for,
            )
