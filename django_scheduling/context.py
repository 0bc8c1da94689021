"""What a running task can ask about its firing: the fire time it serves and whether the
scheduler is stopping.

Both live in context variables, so they follow the task into ``async`` functions, ``asyncio``
tasks and ``asgiref``'s ``sync_to_async``/``async_to_sync``, which copy the context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

__all__ = ["current_fire_time", "shutdown_requested", "firing_context", "stopping_context"]

_fire_time: ContextVar[datetime | None] = ContextVar("django_scheduling_fire_time", default=None)
_stopping: ContextVar[Callable[[], bool] | None] = ContextVar(
    "django_scheduling_stopping", default=None
)


def current_fire_time() -> datetime | None:
    """Return the fire time the running task serves (``None`` in a manual run or outside)."""
    return _fire_time.get()


def shutdown_requested() -> bool:
    """Return whether the scheduler running the current task is shutting down."""
    stopping = _stopping.get()
    return stopping is not None and stopping()


@contextmanager
def firing_context(fire_time: datetime | None) -> Iterator[None]:
    """Make *fire_time* the current fire time while the block runs."""
    token = _fire_time.set(fire_time)
    try:
        yield
    finally:
        _fire_time.reset(token)


@contextmanager
def stopping_context(stopping: Callable[[], bool]) -> Iterator[None]:
    """Make *stopping* answer ``shutdown_requested()`` while the block runs."""
    token = _stopping.set(stopping)
    try:
        yield
    finally:
        _stopping.reset(token)
