"""The database connections of the scheduler's own threads, kept open between uses.

Django closes a connection at the end of each request when ``CONN_MAX_AGE`` is 0 (the default).
A scheduler thread that writes every second would then connect every second, and on PostgreSQL
connecting costs more than the statements. The claims, writer and maintenance threads keep
theirs, and drop one only when it failed, or after it sat idle long enough for a server or a
proxy to have closed it. Task code does not run on them, except under the ``caller_runs`` policy,
where a thread that claims a firing may run it (between the same checks as a worker's).
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
