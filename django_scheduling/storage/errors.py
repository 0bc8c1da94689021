"""What the database's errors say, and which databases the app supports.

The codes are the drivers' own: MySQL/MariaDB's error numbers, PostgreSQL's SQLSTATE. Every
part of the app that needs to tell a lost race from an outage, or a missing table from a
server that is down, asks here.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, ProgrammingError
from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = [
    "CONFLICT",
    "LOCK_TIMEOUT",
    "POSTGRES_LOCK_TIMEOUT",
    "SUPPORTED_VENDORS",
    "describe_database_error",
    "error_code",
    "is_conflict",
    "is_disconnect",
    "is_lock_timeout",
    "missing_table",
]

SUPPORTED_VENDORS = ("mysql", "postgresql", "sqlite")

_MYSQL_DISCONNECTED = {1927, 2006, 2013, 2055, 4031}  # killed, gone away, lost, idle timeout
#: A concurrent transaction won: MySQL's "record has changed" and deadlock, PostgreSQL's
#: serialization failure and deadlock. The database rolled the loser back.
CONFLICT = {1020, 1213, "40001", "40P01"}
#: PostgreSQL's lock_not_available: a row lock another transaction holds was waited for
#: ``lock_timeout``.
POSTGRES_LOCK_TIMEOUT = "55P03"
#: A row lock another transaction holds was waited for too long: PostgreSQL's, and MySQL's
#: lock wait timeout.
LOCK_TIMEOUT = {POSTGRES_LOCK_TIMEOUT, 1205}

# Missing-table errors: SQLite's text, MySQL/MariaDB's ER_NO_SUCH_TABLE, PostgreSQL's SQLSTATE
# undefined_table (psycopg 2 calls it pgcode, psycopg 3 sqlstate) and its text.
_NO_SUCH_TABLE = 1146
_UNDEFINED_TABLE = "42P01"
_MISSING_TABLE_TEXT = re.compile(r"^no such table: |^relation \S+ does not exist")


def error_code(exc: DatabaseError) -> Any:
    """Return the driver's error code: MySQL's number, PostgreSQL's SQLSTATE."""
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)  # psycopg 3, 2
    if sqlstate is not None:
        return sqlstate
    return exc.args[0] if exc.args else None


def is_conflict(exc: BaseException | None) -> bool:
    """Return whether *exc* (or the database error behind it) says that a concurrent
    transaction won: a deadlock, a serialization failure, or a lock wait that timed out. The
    database rolled the losing statement (or transaction) back."""
    while exc is not None:
        if isinstance(exc, DatabaseError) and error_code(exc) in CONFLICT | LOCK_TIMEOUT:
            return True
        exc = exc.__cause__
    return False


def is_lock_timeout(exc: BaseException | None) -> bool:
    """Return whether *exc* (or the database error behind it) says that a row lock another
    transaction holds was waited for too long: trying again at once would wait again."""
    while exc is not None:
        if isinstance(exc, DatabaseError) and error_code(exc) in LOCK_TIMEOUT:
            return True
        exc = exc.__cause__
    return False


def is_disconnect(exc: DatabaseError, conn: BaseDatabaseWrapper) -> bool:
    """Return whether *exc* says that the connection *conn* was lost (and may be opened
    again)."""
    if isinstance(exc, InterfaceError):
        return True
    if conn.vendor == "postgresql":
        # psycopg marks the connection closed when the server ended it (restart, termination).
        raw = conn.connection
        return isinstance(exc, OperationalError) and raw is not None and bool(raw.closed)
    if isinstance(exc, OperationalError) and error_code(exc) in _MYSQL_DISCONNECTED:
        return True
    return isinstance(exc, ProgrammingError) and "closed database" in str(exc)  # sqlite3


def missing_table(exc: BaseException) -> bool:
    """Return whether the database error *exc* (or an error it was raised from) says that a
    table does not exist, as it does before ``migrate``."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        args = getattr(error, "args", ())
        if args and args[0] == _NO_SUCH_TABLE:
            return True
        if _UNDEFINED_TABLE in (getattr(error, "sqlstate", None), getattr(error, "pgcode", None)):
            return True
        if args and isinstance(args[0], str) and _MISSING_TABLE_TEXT.search(args[0]):
            return True
        error = error.__cause__ or error.__context__
    return False


def describe_database_error(exc: BaseException) -> str:
    """Say why the scheduler cannot use the database, and what to do when it is a missing
    table."""
    if missing_table(exc):
        return (
            f"the database has no django_scheduling tables yet ({exc}); "
            "run `python manage.py migrate`"
        )
    return f"the database is unavailable ({exc})"
