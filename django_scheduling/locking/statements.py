"""The pieces of the lock statements for one connection: the table's quoted names, "now"
(the database's clock on MySQL and PostgreSQL, this process's on SQLite), and the clauses that
take many lock rows in name order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper

from ..clock import utcnow
from ..models import TaskLock
from ..storage.sql import any_of, column, datetime_adapter

__all__ = ["LockSql", "strict"]

_STRICT_MODES = {"STRICT_TRANS_TABLES", "STRICT_ALL_TABLES"}


class LockSql:
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
        among, among_params = self.among(names)
        if self.vendor == "postgresql":
            where = (
                f"WHERE {self.name} IN (SELECT {self.name} FROM {self.table} WHERE {among} "
                f"AND {condition} ORDER BY {self.name} FOR UPDATE)"
            )
            return where, [*among_params, *params]
        where = f"WHERE {among} AND {condition}"
        if self.vendor == "mysql":
            where += f" ORDER BY {self.name}"
        return where, [*among_params, *params]

    def among(self, names: list[str]) -> tuple[str, list[Any]]:
        """Return the condition "the lock's name is one of *names*" (see ``sql.any_of``)."""
        return any_of(self.conn, self.name, names)

    def later_of_now_and(self, moment: datetime) -> tuple[str, list[Any]]:
        if self.vendor == "postgresql":
            return "GREATEST(now(), %s::timestamptz)", [self.value(moment)]
        if self.db_time:
            return "GREATEST(UTC_TIMESTAMP(6), CAST(%s AS DATETIME(6)))", [self.value(moment)]
        return "%s", [self.value(max(self.client_now, moment))]


def strict(conn: BaseDatabaseWrapper) -> bool:
    """Return whether the database refuses a value longer than its column."""
    if conn.vendor == "postgresql":
        return True
    return conn.vendor == "mysql" and bool(getattr(conn, "sql_mode", set()) & _STRICT_MODES)
