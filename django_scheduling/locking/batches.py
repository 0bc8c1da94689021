"""Take and release many locks at once: the batch verbs of ``DatabaseLockProvider``.

A burst's locks are taken in one statement per ``lock_at_most_for`` (and one more for the rows
that do not exist yet), and released in one per acquisition, all in name order so that two
instances' batches wait for each other rather than deadlock. With *joined* they run in the
caller's transaction: the scheduler takes a batch's locks, records its runs and claims its fire
times in one commit.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction

from ..clock import utcnow
from ..storage.errors import CONFLICT, POSTGRES_LOCK_TIMEOUT, error_code
from ..storage.sql import rows_of, timestamp_cast
from .base import Lock, LockConfiguration
from .statements import LockSql

if TYPE_CHECKING:
    from .database import DatabaseLockProvider

__all__ = ["lock_many", "unlock_many", "spend"]

logger = logging.getLogger(__name__)

#: The innodb_lock_wait_timeout each MySQL connection of the scheduler was given.
_wait_set: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def lock_many(
    provider: DatabaseLockProvider,
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
    owner = provider.owner
    # In name order, as every statement over many lock rows (see LockSql.in_name_order):
    # inserts of new rows wait on each other's unique keys in that order too.
    configs = sorted(configs, key=lambda config: config.name)
    by_name = {config.name: config for config in configs}
    taken: set[str] = set()
    taken_at = now or utcnow()
    try:
        sql = _joined_sql(provider, configs[0].name, owner) if joined else None
        sql = sql or LockSql(provider._connection(configs[0].name, owner))
        taken_at = sql.client_now if now is None or not sql.db_time else now
        at = sql.value(taken_at)
        groups: dict[timedelta, list[str]] = {}
        for config in configs:
            if config.name not in absent:
                groups.setdefault(config.lock_at_most_for, []).append(config.name)
        if len(groups) + bool(absent) > 1:
            _lock_in_order(provider, sql, [n for names in groups.values() for n in names])
        for most, names in groups.items():
            taken |= _take_many(provider, sql, names, owner, at, sql.value(taken_at + most))
        missing = [by_name[name] for name in sorted(absent) if name in by_name]
        if missing:
            # Rows that do not exist yet are inserted: once per name and database.
            taken |= _insert_many(provider, sql, missing, owner, taken_at)
    except DatabaseError as exc:
        conflict = error_code(exc) in CONFLICT | {POSTGRES_LOCK_TIMEOUT}
        if conflict and not joined:
            # A concurrent locker, or a row another transaction keeps locked: as in lock(),
            # held elsewhere. The statement rolled back, so nothing is taken.
            logger.warning("%d locks were not taken: %s", len(configs) - len(taken), exc)
        else:
            # Locks an earlier statement took here stay held until they expire: the
            # database failed, and no task may run without its lock.
            raise provider._error("take", f"{len(configs)} locks", exc) from exc
    # Locks taken together share their times: a burst claimed ahead holds thousands.
    untils = {most: taken_at + most for most in {by_name[name].lock_at_most_for for name in taken}}
    return {
        name: provider._handle(
            owner,
            by_name[name],
            locked_at=taken_at,
            lock_until=untils[by_name[name].lock_at_most_for],
        )
        for name in taken
    }


def _take_many(
    provider: DatabaseLockProvider, sql: LockSql, names: list[str], owner: str, at: Any, until: Any
) -> set[str]:
    where, params = sql.in_name_order(names, f"{sql.until} <= %s", [at])
    statement = f"UPDATE {sql.table} SET {sql.until} = %s, {sql.at} = %s, {sql.by} = %s {where}"
    count = provider._execute(sql, statement, [until, at, owner, *params])
    if count == len(names):
        return set(names)
    return _mine(provider, sql, names, owner, at) if count else set()


def _lock_in_order(provider: DatabaseLockProvider, sql: LockSql, names: list[str]) -> None:
    """In a transaction that updates lock rows in several statements, lock all of them
    first, in name order: each statement alone takes its rows in that order, but not the
    statements together (see ``LockSql.in_name_order``)."""
    if not sql.joined or sql.vendor == "sqlite":
        return  # one statement per transaction; SQLite locks the whole database
    among, params = sql.among(sorted(names))
    statement = f"SELECT {sql.name} FROM {sql.table} WHERE {among} ORDER BY {sql.name} FOR UPDATE"
    with sql.conn.cursor() as cursor:
        cursor.execute(statement, params)


def _insert_many(
    provider: DatabaseLockProvider,
    sql: LockSql,
    configs: list[LockConfiguration],
    owner: str,
    now: datetime,
) -> set[str]:
    columns = f"{sql.table} ({sql.name}, {sql.until}, {sql.at}, {sql.by})"
    params: list[Any]
    untils = [now + config.lock_at_most_for for config in configs]
    found = rows_of(
        sql.conn, ["text", "timestamptz"], ["name", "until"], [[c.name for c in configs], untils]
    )
    if found is not None:  # one statement text whatever the batch's size
        rows, rows_params = found
        select = f"SELECT v.name, v.until, %s{timestamp_cast(sql.conn)}, %s FROM {rows}"
        if sql.vendor == "postgresql":
            statement = f"INSERT INTO {columns} {select} ON CONFLICT DO NOTHING"
        elif sql.vendor == "mysql":
            statement = f"INSERT IGNORE INTO {columns} {select}"
        else:
            statement = f"INSERT OR IGNORE INTO {columns} {select}"
        params = [sql.value(now), owner, *rows_params]
    else:
        ignore = "INSERT IGNORE" if sql.vendor == "mysql" else "INSERT OR IGNORE"
        rows = ", ".join(["(%s, %s, %s, %s)"] * len(configs))
        params = []
        for config in configs:
            params += [config.name, sql.value(now + config.lock_at_most_for), sql.value(now)]
            params.append(owner)
        statement = f"{ignore} INTO {columns} VALUES {rows}"
    count = provider._execute(sql, statement, params)
    names = [config.name for config in configs]
    if count == len(names):
        return set(names)
    return _mine(provider, sql, names, owner, sql.value(now)) if count else set()


def _mine(
    provider: DatabaseLockProvider, sql: LockSql, names: list[str], owner: str, at: Any
) -> set[str]:
    """Return which of *names* this owner locked at *at*."""
    among, params = sql.among(names)
    statement = (
        f"SELECT {sql.name} FROM {sql.table} WHERE {among} AND {sql.by} = %s AND {sql.at} = %s"
    )
    with sql.conn.cursor() as cursor:
        cursor.execute(statement, [*params, owner, at])
        return {row[0] for row in cursor.fetchall()}


def _joined_sql(provider: DatabaseLockProvider, name: str, owner: str) -> LockSql:
    """Return the statements' pieces on this thread's connection, inside the caller's
    transaction (see ``lock_many``)."""
    conn = connections[provider.using]
    if not conn.in_atomic_block:
        raise RuntimeError("joined lock statements need an atomic() block")
    provider._check(conn, name, owner)
    sql = LockSql(conn)
    sql.joined = True
    # A row another transaction keeps locked (an admin edit, a stuck session) must not
    # hold up a whole batch for long: the scheduler then goes one firing at a time.
    if conn.vendor == "postgresql":
        milliseconds = max(1, provider.lock_wait_timeout // timedelta(milliseconds=1))
        with conn.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = {milliseconds}")
    elif conn.vendor == "mysql":  # whole seconds; the connection is the scheduler's own
        seconds = max(1, round(provider.lock_wait_timeout.total_seconds()))
        # A session variable outlives the transaction (a rollback keeps it): set once per
        # connection, not one more round trip per batch.
        if _wait_set.get(conn.connection) != seconds:
            with conn.cursor() as cursor:
                cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {seconds}")
            _wait_set[conn.connection] = seconds
    return sql


def unlock_many(
    provider: DatabaseLockProvider,
    locks: list[Lock],
    *,
    joined: bool = False,
    by_name: Mapping[Lock, list[str]] | None = None,
) -> set[str]:
    """Release *locks* (handles of this provider), and the locks *by_name* names under the
    handle each was taken with, each not before its ``lock_at_least_for``, in one statement
    per acquisition time; return the names of those that were no longer held by their
    handle (see ``Lock.unlock``).

    A lock released by its name leaves the handle it was taken with as it is: the other
    locks of its batch are released through it too. Raise ``LockError`` if the database
    fails; the handles then stay usable.
    """
    # The handles of this provider (a handle of another provider is not released here).
    mine: list[Any] = [lock for lock in locks if getattr(lock, "_provider", None) is provider]
    for lock in mine:
        lock._check_valid()
    # By acquisition: the names, and the handles to spend once they are released.
    groups: dict[tuple[str, datetime, datetime], tuple[list[str], list[Any]]] = {}
    for lock in mine:
        group = groups.setdefault((lock.owner, lock.locked_at, lock._least_until), ([], []))
        group[0].append(lock.config.name)
        group[1].append(lock)
    for handle, names in (by_name or {}).items():
        if getattr(handle, "_provider", None) is provider:
            key = (handle.owner, handle.locked_at, handle._least_until)  # type: ignore[attr-defined]
            groups.setdefault(key, ([], []))[0].extend(names)
    if not groups:
        return set()
    lost: set[str] = set()
    settled: set[str] = set()  # without a transaction: released, or found lost
    (first_owner, _, _), (first_names, _) = next(iter(groups.items()))
    try:
        sql = (
            _joined_sql(provider, first_names[0], first_owner)
            if joined
            else LockSql(provider._connection(first_names[0], first_owner))
        )
        if len(groups) > 1:
            _lock_in_order(provider, sql, [n for names, _ in groups.values() for n in names])
        for (owner, locked_at, least_until), (names, handles) in groups.items():
            value, value_params = sql.later_of_now_and(least_until)
            at = sql.value(locked_at)
            condition = f"{sql.by} = %s AND {sql.at} = %s"
            where, params = sql.in_name_order(names, condition, [owner, at])
            statement = f"UPDATE {sql.table} SET {sql.until} = {value} {where}"
            count = provider._execute(sql, statement, [*value_params, *params])
            if count != len(names):
                lost |= set(names) - _mine(provider, sql, names, owner, at)
            if joined:
                # Spent once the caller's transaction commits; after a rollback the
                # handles can still release their locks.
                transaction.on_commit(functools.partial(spend, handles), using=sql.conn.alias)
            else:
                spend(handles)
            if not joined:
                settled.update(names)
    except DatabaseError as exc:
        count = sum(len(names) for names, _ in groups.values())
        error = provider._error("release", f"{count} locks", exc)
        # Each statement committed on its own: those names must not be released again.
        error.released = frozenset(settled)
        raise error from exc
    for name in sorted(lost):
        logger.warning(
            "Lock %r was no longer held by this instance when it was released: it expired "
            "and was taken again, or its row was deleted; holders may have overlapped",
            name,
        )
    return lost


def spend(locks: list[Any]) -> None:
    for lock in locks:
        lock._valid = False
