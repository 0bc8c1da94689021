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

import functools
import logging
import threading
import weakref
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import (
    DatabaseError,
    IntegrityError,
    connections,
    transaction,
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
from ..storage.sql import column, datetime_adapter
from .base import BaseLockProvider, Lock, LockConfiguration, LockError

__all__ = ["SUPPORTED_VENDORS", "DatabaseLockProvider", "is_conflict"]

logger = logging.getLogger(__name__)

_OWNER_LENGTH = 255
_KNOWN_NAMES_LIMIT = 1000
_STRICT_MODES = {"STRICT_TRANS_TABLES", "STRICT_ALL_TABLES"}
#: The innodb_lock_wait_timeout each MySQL connection of the scheduler was given.
_wait_set: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


class _Sql:
    """The statements' pieces for one connection; "now" is SQL on MySQL and PostgreSQL and a
    parameter on SQLite."""

    def __init__(self, conn: BaseDatabaseWrapper) -> None:
        q, meta = conn.ops.quote_name, TaskLock._meta
        self.conn, self.table = conn, q(meta.db_table)
        self.name, self.until, self.at, self.by = (
            q(column(TaskLock, f)) for f in ("name", "lock_until", "locked_at", "locked_by")
        )
        self.vendor = conn.vendor
        self.db_time = conn.vendor in ("mysql", "postgresql")
        self.client_now = utcnow()
        self._adapt = datetime_adapter(conn)
        #: The statements run in the caller's transaction and commit with it.
        self.joined = False

    def value(self, moment: datetime) -> Any:
        if settings.USE_TZ:
            return self._adapt(moment)
        return self.conn.ops.adapt_datetimefield_value(moment.astimezone(UTC).replace(tzinfo=None))

    def now(self, plus: timedelta | None = None) -> tuple[str, list[Any]]:
        if not self.db_time:
            return "%s", [self.value(self.client_now + (plus or timedelta(0)))]
        if self.vendor == "postgresql":
            # now(), not clock_timestamp(): now() is the start of the transaction, and each
            # lock statement is a transaction of its own, so it is when the statement started:
            # one instant for locked_at, lock_until and the expiry test, as UTC_TIMESTAMP(6) on
            # MySQL. clock_timestamp() moves while the statement runs, so the stored times and
            # the comparison would disagree. A statement that waited for a row lock (at most
            # lock_wait_timeout) compares with its start: a lock looks held a little longer,
            # never free too early.
            return ("now()", []) if plus is None else ("now() + %s", [plus])
        if plus is None:
            return "UTC_TIMESTAMP(6)", []
        micros = plus // timedelta(microseconds=1)
        return "TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6))", [micros]

    def in_name_order(
        self, names: list[str], condition: str, params: list[Any]
    ) -> tuple[str, list[Any]]:
        """Return the WHERE clause (and its parameters) of an UPDATE of the lock rows *names*
        that meet *condition*, which locks them in name order.

        Every statement that updates many lock rows takes them in the same order, so that two
        transactions over overlapping names (two instances' claims, a claim and a release)
        wait for each other instead of deadlocking: PostgreSQL detects a deadlock only after
        ``deadlock_timeout`` (1 s), and a firing would be that late.
        """
        placeholders = ", ".join(["%s"] * len(names))
        if self.vendor == "postgresql":
            where = (
                f"WHERE {self.name} IN (SELECT {self.name} FROM {self.table} WHERE {self.name} "
                f"IN ({placeholders}) AND {condition} ORDER BY {self.name} FOR UPDATE)"
            )
            return where, [*names, *params]
        where = f"WHERE {self.name} IN ({placeholders}) AND {condition}"
        if self.vendor == "mysql":
            where += f" ORDER BY {self.name}"
        return where, [*names, *params]

    def later_of_now_and(self, moment: datetime) -> tuple[str, list[Any]]:
        if self.vendor == "postgresql":
            return "GREATEST(now(), %s::timestamptz)", [self.value(moment)]
        if self.db_time:
            return "GREATEST(UTC_TIMESTAMP(6), CAST(%s AS DATETIME(6)))", [self.value(moment)]
        return "%s", [self.value(max(self.client_now, moment))]


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
            sql = _Sql(self._connection(config.name, owner))
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
        return _DatabaseLock(self, owner, config, locked_at=locked_at, lock_until=lock_until)

    def lock_many(
        self,
        configs: list[LockConfiguration],
        *,
        now: datetime | None = None,
        absent: Collection[str] = (),
        joined: bool = False,
    ) -> dict[str, Lock]:
        """Take every lock of *configs* that is free at *now*, in one statement whatever their
        number, and return the locks taken, by name. *absent* names the locks whose row did
        not exist when the caller looked: they are inserted, in one more statement. One more
        tells which ones this call took when another instance took some at the same moment.

        *now* is the database's clock, read by the caller's statement just before; ``None``
        on SQLite, whose locks go by this process's clock. It stands for the time of the
        acquisition: a lock that expires between that read and this statement counts as held
        (never free too early), and the locks taken, which all have ``locked_at`` *now*,
        expire that little bit sooner. Raise ``LockError`` if the database fails: then none
        is taken.

        With *joined*, the statements run in the transaction of the caller's ``atomic()``
        block on this thread's connection, and take effect when it commits; the scheduler
        takes a batch's locks, records its runs and claims its fire times in one commit.
        """
        if not configs:
            return {}
        owner = self.owner
        # In name order, as every statement over many lock rows (see _Sql.in_name_order):
        # inserts of new rows wait on each other's unique keys in that order too.
        configs = sorted(configs, key=lambda config: config.name)
        by_name = {config.name: config for config in configs}
        taken: set[str] = set()
        taken_at = now or utcnow()
        try:
            sql = self._joined_sql(configs[0].name, owner) if joined else None
            sql = sql or _Sql(self._connection(configs[0].name, owner))
            taken_at = sql.client_now if now is None or not sql.db_time else now
            at = sql.value(taken_at)
            groups: dict[timedelta, list[str]] = {}
            for config in configs:
                if config.name not in absent:
                    groups.setdefault(config.lock_at_most_for, []).append(config.name)
            if len(groups) + bool(absent) > 1:
                self._lock_in_order(sql, [n for names in groups.values() for n in names])
            for most, names in groups.items():
                taken |= self._take_many(sql, names, owner, at, sql.value(taken_at + most))
            missing = [by_name[name] for name in sorted(absent) if name in by_name]
            if missing:
                # Rows that do not exist yet are inserted: once per name and database.
                taken |= self._insert_many(sql, missing, owner, taken_at)
        except DatabaseError as exc:
            conflict = error_code(exc) in CONFLICT | {POSTGRES_LOCK_TIMEOUT}
            if conflict and not joined:
                # A concurrent locker, or a row another transaction keeps locked: as in lock(),
                # held elsewhere. The statement rolled back, so nothing is taken.
                logger.warning("%d locks were not taken: %s", len(configs) - len(taken), exc)
            else:
                # Locks an earlier statement took here stay held until they expire: the
                # database failed, and no task may run without its lock.
                raise self._error("take", f"{len(configs)} locks", exc) from exc
        # Locks taken together share their times: a burst claimed ahead holds thousands.
        untils = {
            most: taken_at + most for most in {by_name[name].lock_at_most_for for name in taken}
        }
        return {
            name: _DatabaseLock(
                self,
                owner,
                by_name[name],
                locked_at=taken_at,
                lock_until=untils[by_name[name].lock_at_most_for],
            )
            for name in taken
        }

    def _take_many(self, sql: _Sql, names: list[str], owner: str, at: Any, until: Any) -> set[str]:
        where, params = sql.in_name_order(names, f"{sql.until} <= %s", [at])
        statement = f"UPDATE {sql.table} SET {sql.until} = %s, {sql.at} = %s, {sql.by} = %s {where}"
        count = self._execute(sql, statement, [until, at, owner, *params])
        if count == len(names):
            return set(names)
        return self._mine(sql, names, owner, at) if count else set()

    def _lock_in_order(self, sql: _Sql, names: list[str]) -> None:
        """In a transaction that updates lock rows in several statements, lock all of them
        first, in name order: each statement alone takes its rows in that order, but not the
        statements together (see ``_Sql.in_name_order``)."""
        if not sql.joined or sql.vendor == "sqlite":
            return  # one statement per transaction; SQLite locks the whole database
        placeholders = ", ".join(["%s"] * len(names))
        statement = (
            f"SELECT {sql.name} FROM {sql.table} WHERE {sql.name} IN ({placeholders}) "
            f"ORDER BY {sql.name} FOR UPDATE"
        )
        with sql.conn.cursor() as cursor:
            cursor.execute(statement, sorted(names))

    def _insert_many(
        self, sql: _Sql, configs: list[LockConfiguration], owner: str, now: datetime
    ) -> set[str]:
        ignore = {"mysql": "INSERT IGNORE", "sqlite": "INSERT OR IGNORE"}.get(sql.vendor, "INSERT")
        conflict = " ON CONFLICT DO NOTHING" if sql.vendor == "postgresql" else ""
        rows = ", ".join(["(%s, %s, %s, %s)"] * len(configs))
        params: list[Any] = []
        for config in configs:
            params += [config.name, sql.value(now + config.lock_at_most_for), sql.value(now), owner]
        statement = (
            f"{ignore} INTO {sql.table} ({sql.name}, {sql.until}, {sql.at}, {sql.by}) "
            f"VALUES {rows}{conflict}"
        )
        count = self._execute(sql, statement, params)
        names = [config.name for config in configs]
        if count == len(names):
            return set(names)
        return self._mine(sql, names, owner, sql.value(now)) if count else set()

    def _mine(self, sql: _Sql, names: list[str], owner: str, at: Any) -> set[str]:
        """Return which of *names* this owner locked at *at*."""
        placeholders = ", ".join(["%s"] * len(names))
        statement = (
            f"SELECT {sql.name} FROM {sql.table} WHERE {sql.name} IN ({placeholders}) "
            f"AND {sql.by} = %s AND {sql.at} = %s"
        )
        with sql.conn.cursor() as cursor:
            cursor.execute(statement, [*names, owner, at])
            return {row[0] for row in cursor.fetchall()}

    def _joined_sql(self, name: str, owner: str) -> _Sql:
        """Return the statements' pieces on this thread's connection, inside the caller's
        transaction (see ``lock_many``)."""
        conn = connections[self.using]
        if not conn.in_atomic_block:
            raise RuntimeError("joined lock statements need an atomic() block")
        self._check(conn, name, owner)
        sql = _Sql(conn)
        sql.joined = True
        # A row another transaction keeps locked (an admin edit, a stuck session) must not
        # hold up a whole batch for long: the scheduler then goes one firing at a time.
        if conn.vendor == "postgresql":
            milliseconds = max(1, self.lock_wait_timeout // timedelta(milliseconds=1))
            with conn.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = {milliseconds}")
        elif conn.vendor == "mysql":  # whole seconds; the connection is the scheduler's own
            seconds = max(1, round(self.lock_wait_timeout.total_seconds()))
            # A session variable outlives the transaction (a rollback keeps it): set once per
            # connection, not one more round trip per batch.
            if _wait_set.get(conn.connection) != seconds:
                with conn.cursor() as cursor:
                    cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {seconds}")
                _wait_set[conn.connection] = seconds
        return sql

    def unlock_many(self, locks: list[Lock], *, joined: bool = False) -> set[str]:
        """Release *locks* (handles of this provider), each not before its
        ``lock_at_least_for``, in one statement per acquisition time; return the names of
        those that were no longer held by their handle (see ``Lock.unlock``).

        Raise ``LockError`` if the database fails; the handles then stay usable.
        """
        mine = [lock for lock in locks if isinstance(lock, _DatabaseLock)]
        for lock in mine:
            lock._check_valid()
        lost: set[str] = set()
        groups: dict[tuple[str, datetime, datetime], list[_DatabaseLock]] = {}
        for lock in mine:
            groups.setdefault((lock.owner, lock.locked_at, lock._least_until), []).append(lock)
        try:
            sql = None
            if mine:
                name, owner = mine[0].config.name, mine[0].owner
                sql = (
                    self._joined_sql(name, owner) if joined else _Sql(self._connection(name, owner))
                )
            if sql is not None and len(groups) > 1:
                self._lock_in_order(sql, [lock.config.name for lock in mine])
            for (owner, locked_at, least_until), group in groups.items():
                assert sql is not None
                names = [lock.config.name for lock in group]
                value, value_params = sql.later_of_now_and(least_until)
                at = sql.value(locked_at)
                condition = f"{sql.by} = %s AND {sql.at} = %s"
                where, params = sql.in_name_order(names, condition, [owner, at])
                statement = f"UPDATE {sql.table} SET {sql.until} = {value} {where}"
                count = self._execute(sql, statement, [*value_params, *params])
                if count != len(names):
                    lost |= set(names) - self._mine(sql, names, owner, at)
                if joined:
                    # Spent once the caller's transaction commits; after a rollback the
                    # handles can still release their locks.
                    transaction.on_commit(functools.partial(_spend, group), using=sql.conn.alias)
                else:
                    _spend(group)
        except DatabaseError as exc:
            raise self._error("release", f"{len(mine)} locks", exc) from exc
        for name in sorted(lost):
            logger.warning(
                "Lock %r was no longer held by this instance when it was released: it expired "
                "and was taken again, or its row was deleted; holders may have overlapped",
                name,
            )
        return lost

    def _upsert(
        self, sql: _Sql, config: LockConfiguration, owner: str
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

    def _acquire(self, sql: _Sql, config: LockConfiguration, owner: str) -> bool:
        if config.name in self._known:
            # A row count of 0 means held, or the row was deleted (admin, test flush): the
            # INSERT tells which, so a deleted row never blocks the lock for good.
            return self._update(sql, config, owner) or self._insert(sql, config, owner)
        return self._insert(sql, config, owner) or self._update(sql, config, owner)

    def _insert(self, sql: _Sql, config: LockConfiguration, owner: str) -> bool:
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

    def _update(self, sql: _Sql, config: LockConfiguration, owner: str) -> bool:
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
        self, sql: _Sql, config: LockConfiguration, owner: str, locked_at: datetime | None = None
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

    def _unlock(self, lock: _DatabaseLock) -> bool:
        name = lock.config.name
        try:
            sql = _Sql(self._connection(name, lock.owner))
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

    def _extend(self, lock: _DatabaseLock, config: LockConfiguration) -> Lock | None:
        try:
            sql = _Sql(self._connection(config.name, lock.owner))
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
        return _DatabaseLock(self, lock.owner, config, **times)

    def _check(self, conn: BaseDatabaseWrapper, name: str, owner: str) -> None:
        alias = conn.alias
        if conn.vendor not in SUPPORTED_VENDORS:
            raise ImproperlyConfigured(
                f"DatabaseLockProvider supports {', '.join(SUPPORTED_VENDORS)}; the database "
                f"{alias!r} is {conn.vendor}. Set SCHEDULING['DATABASE'] to a supported one."
            )
        max_name = TaskLock._meta.get_field("name").max_length or 0
        if len(owner) > _OWNER_LENGTH or (len(name) > max_name and not _strict(conn)):
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

    def _execute(self, sql: _Sql, statement: str, params: list[Any], *, fetch: bool = False) -> Any:
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


def _spend(locks: list[_DatabaseLock]) -> None:
    for lock in locks:
        lock._valid = False


def _strict(conn: BaseDatabaseWrapper) -> bool:
    """Return whether the database refuses a value longer than its column."""
    if conn.vendor == "postgresql":
        return True
    return conn.vendor == "mysql" and bool(getattr(conn, "sql_mode", set()) & _STRICT_MODES)


class _DatabaseLock(Lock):
    __slots__ = ("_provider", "owner")

    def __init__(
        self, provider: DatabaseLockProvider, owner: str, config: LockConfiguration, **times: Any
    ) -> None:
        super().__init__(config, **times)
        self._provider, self.owner = provider, owner

    def _unlock(self) -> bool:
        return self._provider._unlock(self)

    def _extend(self, config: LockConfiguration) -> Lock | None:
        return self._provider._extend(self, config)
