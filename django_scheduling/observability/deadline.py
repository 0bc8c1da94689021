"""Calls that a page waits for with a deadline: an engine's result backend that accepts
connections but never answers (Celery's Redis backend waits 120 s for a reply by default) must
not hold up the page, nor the web worker that serves it.

The calls run on a small thread pool shared by the process, created on first use. A call that
misses its deadline keeps its thread until the backend answers or gives up; a call still queued
then is dropped. Each call closes the database connections it opened on its thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

__all__ = ["OUTCOME_TIMEOUT", "MissedDeadline", "call_with_deadline"]

#: How long the run's page waits for an engine to report an enqueued run's outcome, in seconds.
OUTCOME_TIMEOUT = 2.0
#: Threads of the pool: lookups that miss their deadline hold at most this many threads.
POOL_THREADS = 2

T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


class MissedDeadline(TimeoutError):
    """The call did not return within its deadline."""


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=POOL_THREADS, thread_name_prefix="scheduling-lookup"
            )
        return _pool


def _closing_connections(func: Callable[[], T]) -> T:
    from django.db import connections

    try:
        return func()
    finally:
        # The pool's threads outlive requests: keep no database connection open on them.
        connections.close_all()


def call_with_deadline(func: Callable[[], T], *, timeout: float) -> T:
    """Return what *func* returns, called on the shared pool, or raise ``MissedDeadline`` when it
    has not returned within *timeout* seconds (counted from the submission, time spent queued
    included). An exception that *func* raises is raised here.
    """
    future = _executor().submit(_closing_connections, func)
    # wait(), not result(timeout=...): a socket timeout that *func* raises is a TimeoutError
    # too, and is *func*'s error to report, not a missed deadline.
    done, _ = wait([future], timeout=timeout)
    if not done:
        future.cancel()  # still queued behind calls that hang: drop it
        raise MissedDeadline(f"no answer within {timeout:g} s")
    return future.result()
