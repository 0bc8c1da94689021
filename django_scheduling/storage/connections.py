"""The database connections of the scheduler's own threads, kept open between uses.

Django closes a connection at the end of each request when ``CONN_MAX_AGE`` is 0 (the default).
A scheduler thread that writes every second would then connect every second, and on PostgreSQL
connecting costs more than the statements. The claims, writer and maintenance threads keep
theirs, and drop one only when it failed, or after it sat idle long enough for a server or a
proxy to have closed it. On SQLite their page cache is capped (``SQLITE_CACHE_KIB``). Task code
does not run on them, except under the ``caller_runs`` policy, where a thread that claims a
firing may run it (between the same checks as a worker's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connections

__all__ = ["KeptConnection", "IDLE_LIMIT"]

#: A connection idle for longer than this is closed before its next use rather than trusted:
#: servers and proxies drop idle connections (MySQL's ``wait_timeout``, PgBouncer).
IDLE_LIMIT = 60.0

#: SQLite's page cache for each of these connections, in KiB (SQLite's default: 2,000 KiB per
#: connection, in this process's memory). Another connection's commit empties a connection's
#: cache in WAL mode, and the scheduler's threads commit every second: the cache only serves
#: the pages a statement reads again within one transaction. With 10,000 tasks, the default
#: filled to 2 MB on each of the claims and writer connections and stayed there.
SQLITE_CACHE_KIB = 256


class KeptConnection:
    """Each thread's connection to the database *using*, kept open between its uses."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._local = threading.local()

    @contextmanager
    def use(self) -> Iterator[None]:
        """Use this thread's connection for the block; reconnect first if it is broken or
        has been idle too long."""
        conn = connections[self.using]
        last = getattr(self._local, "last_used", None)
        if conn.connection is not None and (
            (last is not None and time.monotonic() - last > IDLE_LIMIT) or _broken(conn)
        ):
            _close(conn)
        try:
            yield
        finally:
            self._local.last_used = time.monotonic()
            if conn.connection is not None and _broken(conn):
                _close(conn)
            elif conn.connection is not None and conn.vendor == "sqlite":
                self._size_cache(conn)

    def _size_cache(self, conn: Any) -> None:
        """Cap the page cache of a new SQLite connection of this thread at ``SQLITE_CACHE_KIB``
        (a smaller one, from the project's ``init_command``, stays). On the DB-API connection,
        as Django runs ``init_command``: a setting of the connection, not a query of the
        scheduler's."""
        raw = conn.connection
        if getattr(self._local, "sized", None) is raw:
            return
        try:
            with conn.wrap_database_errors:
                (size,) = raw.execute("PRAGMA cache_size").fetchone()
                if size > 0:  # in pages rather than KiB
                    size = -size * raw.execute("PRAGMA page_size").fetchone()[0] // 1024
                if -size > SQLITE_CACHE_KIB:
                    raw.execute(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")
        except DatabaseError:
            return  # tried again after its next use
        self._local.sized = raw


def _broken(conn: Any) -> bool:
    if not conn.errors_occurred:
        return False
    try:
        usable = conn.is_usable()
    except DatabaseError:
        usable = False
    if usable:
        conn.errors_occurred = False
    return not usable


def _close(conn: Any) -> None:
    try:
        conn.close()
    except DatabaseError:
        pass  # a broken connection is dropped all the same
