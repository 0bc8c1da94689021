"""Locks in the ``TaskLock`` table, shared by every instance that uses the same database.

The only code that writes the table. As in ShedLock: take a new or expired lock, then unlock or
extend it with UPDATEs conditioned on the holder; the row count decides and rows are never
deleted. "Now" is the database server's clock on MySQL/MariaDB (``UTC_TIMESTAMP(6)``) and on
PostgreSQL (``now()``), so instances with skewed clocks agree, and this process's clock on
SQLite. MySQL and SQLite take a lock with an INSERT for a new name and a conditional UPDATE of an
expired row; PostgreSQL with one ``INSERT ... ON CONFLICT (name) DO UPDATE ... WHERE``.

Each statement commits on its own, never in the caller's transaction: on the thread's connection
when it is in autocommit, else on a private connection of the thread. A lock taken inside
``atomic()`` is thus seen at once and survives a rollback. SQLite has one writer: with
``transaction_mode`` IMMEDIATE or EXCLUSIVE, locking inside ``atomic()`` raises ``LockError`` at
once; in DEFERRED mode it waits (up to the ``timeout`` option) if that transaction has written.
On PostgreSQL a statement waits at most ``lock_wait_timeout`` for a lock row that another
transaction has locked (an admin edit, a stuck session); then the lock counts as held elsewhere,
and an unlock or extend raises ``LockError``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import (
    DatabaseError,
    IntegrityError,
    connections,
)
from django.db.backends.base.base import BaseDatabaseWrapper

from ..clock import utcnow
from ..conf import get_settings
from ..models import TaskLock
from ..storage.errors import (
    CONFLICT,
    POSTGRES_LOCK_TIMEOUT,
    SUPPORTED_VENDORS,
    error_code,
    is_conflict,
    is_disconnect,
)
from . import batches
from .base import BaseLockProvider, Lock, LockConfiguration, LockError
from .statements import LockSql, strict

__all__ = ["SUPPORTED_VENDORS", "DatabaseLockProvider", "is_conflict"]

logger = logging.getLogger(__name__)

_OWNER_LENGTH = 255
_KNOWN_NAMES_LIMIT = 1000


class DatabaseLockProvider(BaseLockProvider):
    """Take locks in the ``TaskLock`` table of the database *using*.

    *using* defaults to ``SCHEDULING['DATABASE']`` and *owner*, stored as ``locked_by``, to
    ``SCHEDULING['INSTANCE_NAME']`` (``host:pid``); both are read when a lock is taken, so
    creating a provider runs no query and a forked child uses its own pid.
    """

    #: Batches of locks are taken and released in the caller's transaction.
    supports_batches = True
    #: How long a statement waits on PostgreSQL for a lock row another transaction has locked.
    lock_wait_timeout = timedelta(seconds=2)

    def __init__(self, using: str | None = None, owner: str | None = None) -> None:
        if owner is not None and not (0 < len(owner) <= _OWNER_LENGTH):
            raise ValueError(f"owner must have 1 to {_OWNER_LENGTH} characters, got {owner!r}")
        self._using, self._owner = using, owner
        self._known: set[str] = set()  # names whose row exists: lock() skips the INSERT
        self._local = threading.local()  # this thread's private connections, by alias

    def __repr__(self) -> str:
        return f"<DatabaseLockProvider using={self._using!r} owner={self._owner!r}>"

    @property
    def using(self) -> str:
        return self._using or get_settings().database

    @property
    def owner(self) -> str:
        return self._owner or get_settings().instance_name

    def clear_cache(self) -> None:
        """Forget which lock rows are known to exist."""
        self._known.clear()

    def close(self) -> None:
        """Close the private connections this thread opened for locks inside transactions."""
        for conn in self._local.__dict__.pop("connections", {}).values():
            conn.close()

    def lock(self, config: LockConfiguration) -> Lock | None:
        """Return a held lock for *config*, or ``None`` if it is held elsewhere."""
        owner = self.owner
        try:
            sql = LockSql(self._connection(config.name, owner))
            if sql.vendor == "postgresql":
                times = self._upsert(sql, config, owner)
            elif self._acquire(sql, config, owner):
                times = self._read_times(sql, config, owner)
            else:
                times = None
        except DatabaseError as exc:
            if error_code(exc) in CONFLICT:
                logger.warning("Lock %r lost a race with a concurrent locker: %s", config.name, exc)
                return None
            if error_code(exc) == POSTGRES_LOCK_TIMEOUT:
                logger.warning(
                    "Lock %r: its row stayed locked by another transaction for %s; "
                    "counted as held elsewhere",
                    config.name,
                    self.lock_wait_timeout,
                )
                return None
            raise self._error("take", config.name, exc) from exc
        if times is None:
            logger.debug("Lock %r is held elsewhere", config.name)
            return None
        locked_at, lock_until = times
        logger.debug("Acquired lock %r until %s as %s", config.name, lock_until, owner)
        return DatabaseLock(self, owner, config, locked_at=locked_at, lock_until=lock_until)

    def _handle(
        self, owner: str, config: LockConfiguration, *, locked_at: datetime, lock_until: datetime
    ) -> DatabaseLock:
        return DatabaseLock(self, owner, config, locked_at=locked_at, lock_until=lock_until)

    def lock_many(
        self,
        configs: list[LockConfiguration],
        *,
        now: datetime | None = None,
        absent: Collection[str] = (),
        joined: bool = False,
    ) -> dict[str, Lock]:
        """Take every lock of *configs* that is free at *now*, in one statement whatever their
        number, and return the locks taken, by name (see ``batches.lock_many``)."""
        return batches.lock_many(self, configs, now=now, absent=absent, joined=joined)

    def unlock_many(
        self,
        locks: list[Lock],
        *,
        joined: bool = False,
        by_name: Mapping[Lock, list[str]] | None = None,
    ) -> set[str]:
        """Release *locks*, and those *by_name* names, in one statement per acquisition
        time; return the names of those no longer held by their handle (see
        ``batches.unlock_many``)."""
        return batches.unlock_many(self, locks, joined=joined, by_name=by_name)

    def _upsert(
        self, sql: LockSql, config: LockConfiguration, owner: str
    ) -> tuple[datetime, datetime] | None:
        """Take the lock in one statement (PostgreSQL): insert the row, or take it over if it
        has expired; return the stored (locked_at, lock_until), or ``None`` if it is held."""
        until, until_params = sql.now(config.lock_at_most_for)
        statement = (
            f"INSERT INTO {sql.table} ({sql.name}, {sql.until}, {sql.at}, {sql.by}) "
            f"VALUES (%s, {until}, now(), %s) ON CONFLICT ({sql.name}) DO UPDATE "
            f"SET {sql.until} = EXCLUDED.{sql.until}, {sql.at} = EXCLUDED.{sql.at}, "
            f"{sql.by} = EXCLUDED.{sql.by} WHERE {sql.table}.{sql.until} <= now() "
            f"RETURNING {sql.at}, {sql.until}"
        )
        row = self._execute(sql, statement, [config.name, *until_params, owner], fetch=True)
        return None if row is None else (row[0].astimezone(UTC), row[1].astimezone(UTC))

    def _acquire(self, sql: LockSql, config: LockConfiguration, owner: str) -> bool:
        if config.name in self._known:
            # A row count of 0 means held, or the row was deleted (admin, test flush): the
            # INSERT tells which, so a deleted row never blocks the lock for good.
            return self._update(sql, config, owner) or self._insert(sql, config, owner)
        return self._insert(sql, config, owner) or self._update(sql, config, owner)

    def _insert(self, sql: LockSql, config: LockConfiguration, owner: str) -> bool:
        until, until_params = sql.now(config.lock_at_most_for)
        now, now_params = sql.now()
        statement = (
            f"INSERT INTO {sql.table} ({sql.name}, {sql.until}, {sql.at}, {sql.by}) "
            f"VALUES (%s, {until}, {now}, %s)"
        )
        params = [config.name, *until_params, *now_params, owner]
        try:
            inserted = self._execute(sql, statement, params)
        except IntegrityError:
            inserted = 0  # the row exists
        self._remember(config.name)
        return inserted == 1

    def _update(self, sql: LockSql, config: LockConfiguration, owner: str) -> bool:
        until, until_params = sql.now(config.lock_at_most_for)
        now, now_params = sql.now()
        statement = (
            f"UPDATE {sql.table} SET {sql.until} = {until}, {sql.at} = {now}, {sql.by} = %s "
            f"WHERE {sql.name} = %s AND {sql.until} <= {now}"
        )
        params = [*until_params, *now_params, owner, config.name, *now_params]
        try:
            return self._execute(sql, statement, params) == 1
        except DatabaseError:
            self._known.discard(config.name)
            raise

    def _remember(self, name: str) -> None:
        if len(self._known) >= _KNOWN_NAMES_LIMIT:
            self._known.clear()
        self._known.add(name)

    def _read_times(
        self, sql: LockSql, config: LockConfiguration, owner: str, locked_at: datetime | None = None
    ) -> tuple[datetime, datetime]:
        """Return the stored (locked_at, lock_until) of a lock this provider just wrote."""
        if not sql.db_time:
            return locked_at or sql.client_now, sql.client_now + config.lock_at_most_for
        statement = f"SELECT {sql.at}, {sql.until} FROM {sql.table} WHERE {sql.name} = %s "
        statement += f"AND {sql.by} = %s" + (f" AND {sql.at} = %s" if locked_at else "")
        params = [config.name, owner, *([sql.value(locked_at)] if locked_at else [])]
        row = self._execute(sql, statement, params, fetch=True)
        if row is None:  # already taken over (lock_at_most_for ~ 0): the handle cannot act
            now = utcnow()
            return locked_at or now, now + config.lock_at_most_for
        return row[0].replace(tzinfo=UTC), row[1].replace(tzinfo=UTC)

    def _unlock(self, lock: DatabaseLock) -> bool:
        name = lock.config.name
        try:
            sql = LockSql(self._connection(name, lock.owner))
            value, params = sql.later_of_now_and(lock._least_until)
            statement = (
                f"UPDATE {sql.table} SET {sql.until} = {value} "
                f"WHERE {sql.name} = %s AND {sql.by} = %s AND {sql.at} = %s"
            )
            params += [name, lock.owner, sql.value(lock.locked_at)]
            released = self._execute(sql, statement, params) == 1
        except DatabaseError as exc:
            raise self._error("release", name, exc) from exc
        if released:
            logger.debug("Unlocked %r", name)
        else:
            logger.warning(
                "Lock %r was no longer held by %s (acquired at %s) when it was released: it "
                "expired and was taken again, or its row was deleted; holders may have overlapped",
                name,
                lock.owner,
                lock.locked_at,
            )
        return released

    def _extend(self, lock: DatabaseLock, config: LockConfiguration) -> Lock | None:
        try:
            sql = LockSql(self._connection(config.name, lock.owner))
            until, until_params = sql.now(config.lock_at_most_for)
            now, now_params = sql.now()
            statement = (
                f"UPDATE {sql.table} SET {sql.until} = {until} WHERE {sql.name} = %s "
                f"AND {sql.by} = %s AND {sql.at} = %s AND {sql.until} > {now}"
            )
            locked_at = sql.value(lock.locked_at)
            params = [*until_params, config.name, lock.owner, locked_at, *now_params]
            if sql.vendor == "postgresql":
                row = self._execute(sql, f"{statement} RETURNING {sql.until}", params, fetch=True)
                extended = None if row is None else row[0].astimezone(UTC)
            elif self._execute(sql, statement, params) == 1:
                _, extended = self._read_times(sql, config, lock.owner, lock.locked_at)
            else:
                extended = None
        except DatabaseError as exc:
            raise self._error("extend", config.name, exc) from exc
        if extended is None:
            logger.debug("Could not extend lock %r: no longer held", config.name)
            return None
        least_until = extended - config.lock_at_most_for + config.lock_at_least_for
        times = {"locked_at": lock.locked_at, "lock_until": extended, "least_until": least_until}
        return DatabaseLock(self, lock.owner, config, **times)

    def _check(self, conn: BaseDatabaseWrapper, name: str, owner: str) -> None:
        alias = conn.alias
        if conn.vendor not in SUPPORTED_VENDORS:
            raise ImproperlyConfigured(
                f"DatabaseLockProvider supports {', '.join(SUPPORTED_VENDORS)}; the database "
                f"{alias!r} is {conn.vendor}. Set SCHEDULING['DATABASE'] to a supported one."
            )
        max_name = TaskLock._meta.get_field("name").max_length or 0
        if len(owner) > _OWNER_LENGTH or (len(name) > max_name and not strict(conn)):
            raise LockError(
                f"Lock name {name[:40]!r}... ({len(name)} characters) or owner {owner!r} "
                f"is too long for the table; the limits are {max_name} and {_OWNER_LENGTH}"
            )

    def _connection(self, name: str, owner: str) -> BaseDatabaseWrapper:
        """Return a usable connection whose statements commit at once, outside the caller's
        transaction."""
        alias = self.using
        conn = connections[alias]
        self._check(conn, name, owner)
        if conn.in_atomic_block or (conn.connection is not None and not conn.get_autocommit()):
            if (
                conn.vendor == "sqlite"
                and (mode := getattr(conn, "transaction_mode", None)) in ("IMMEDIATE", "EXCLUSIVE")
                and conn.connection is not None
                and conn.connection.in_transaction
            ):
                raise LockError(
                    f"Cannot lock {name!r} inside a transaction on SQLite database {alias!r}: "
                    f"its {mode} transaction holds the write lock the lock needs"
                )
            private = self._local.__dict__.setdefault("connections", {})
            if alias not in private:
                private[alias] = connections.create_connection(alias)
            conn = private[alias]
        # Close a connection that is broken, not one that CONN_MAX_AGE calls old: connection
        # age is the caller's request-boundary business (the scheduler cleans up around each
        # firing), and reconnecting before every lock statement would double its cost. A
        # server that dropped an idle connection is handled by the retry in _execute.
        if conn.connection is not None and conn.errors_occurred and not conn.is_usable():
            try:
                conn.close()
            except DatabaseError:
                pass  # closing a broken connection failed; it is dropped all the same
        return conn

    def _execute(
        self, sql: LockSql, statement: str, params: list[Any], *, fetch: bool = False
    ) -> Any:
        """Run one statement and return its row count (or first row), reconnecting once if the
        connection was lost."""
        for attempt in (1, 2):
            try:
                with sql.conn.cursor() as cursor:
                    if sql.vendor == "postgresql" and not sql.joined:
                        return self._execute_bounded(cursor, statement, params, fetch)
                    cursor.execute(statement, params)
                    return cursor.fetchone() if fetch else cursor.rowcount
            except DatabaseError as exc:
                if attempt == 2 or sql.joined or not is_disconnect(exc, sql.conn):
                    raise
                logger.warning("Lost the connection to %r (%s); reconnecting", sql.conn.alias, exc)
                try:
                    sql.conn.close()
                except DatabaseError:
                    pass
        raise AssertionError("unreachable")

    def _execute_bounded(self, cursor: Any, statement: str, params: list[Any], fetch: bool) -> Any:
        """Run *statement* in a transaction of its own whose waits for row locks end after
        ``lock_wait_timeout`` (PostgreSQL: ``SET LOCAL`` needs the transaction block)."""
        milliseconds = max(1, self.lock_wait_timeout // timedelta(milliseconds=1))
        cursor.execute(f"BEGIN; SET LOCAL lock_timeout = {milliseconds}")
        try:
            cursor.execute(statement, params)
            result = cursor.fetchone() if fetch else cursor.rowcount
        except BaseException:
            try:
                cursor.execute("ROLLBACK")
            except DatabaseError:
                pass  # the connection is gone; the server ended the transaction with it
            raise
        cursor.execute("COMMIT")
        return result

    def _error(self, action: str, name: str, exc: Exception) -> LockError:
        logger.warning("Could not %s lock %r on database %r: %s", action, name, self.using, exc)
        return LockError(f"Could not {action} lock {name!r} on database {self.using!r}: {exc}")


class DatabaseLock(Lock):
    __slots__ = ("_provider", "owner")

    def __init__(
        self, provider: DatabaseLockProvider, owner: str, config: LockConfiguration, **times: Any
    ) -> None:
        super().__init__(config, **times)
        self._provider, self.owner = provider, owner

    def _shared(self) -> tuple[Any, ...]:
        # A handle is its configuration, times, owner and provider: the locks that one
        # lock_many() took with the same durations share all but their names.
        config = self.config
        return (
            self._provider,
            self.owner,
            self.locked_at,
            self.lock_until,
            self._least_until,
            config.lock_at_most_for,
            config.lock_at_least_for,
        )

    def _named(self, name: str) -> DatabaseLock:
        return DatabaseLock(
            self._provider,
            self.owner,
            self.config._renamed(name),
            locked_at=self.locked_at,
            lock_until=self.lock_until,
            least_until=self._least_until,
        )

    def _unlock(self) -> bool:
        return self._provider._unlock(self)

    def _extend(self, config: LockConfiguration) -> Lock | None:
        return self._provider._extend(self, config)
