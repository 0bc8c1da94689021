"""What a running task can ask about its firing: the fire time it serves, whether the
scheduler is stopping, and whether the run should stop (its timeout passed, or a shutdown).

They live in context variables, so they follow the task into ``async`` functions, ``asyncio``
tasks and ``asgiref``'s ``sync_to_async``/``async_to_sync``, which copy the context.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta

__all__ = [
    "EnqueuedTooLate",
    "RunTimedOut",
    "cancel_requested",
    "current_fire_time",
    "shutdown_requested",
    "set_firing",
    "stopping_context",
]

_fire_time: ContextVar[datetime | None] = ContextVar("django_scheduling_fire_time", default=None)
_stopping: ContextVar[Callable[[], bool] | None] = ContextVar(
    "django_scheduling_stopping", default=None
)
#: When the running task passes its timeout, on the ``time.monotonic()`` clock.
_deadline: ContextVar[float | None] = ContextVar("django_scheduling_deadline", default=None)


class RunTimedOut(TimeoutError):
    """A run went on past its ``timeout=``: the exception that ``run_failed`` carries for it.

    The task was not stopped (Python cannot stop a thread); *failure* is the exception the
    task raised in the end, if it raised one (also its ``__cause__``).
    """

    def __init__(
        self,
        task: str,
        duration: timedelta,
        timeout: timedelta,
        failure: BaseException | None = None,
    ) -> None:
        from .schedules.durations import format_duration

        outcome = (
            "then succeeded"
            if failure is None
            else f"then failed: {type(failure).__name__}: {failure}"
        )
        super().__init__(
            f"{task} ran {format_duration(duration)}, past its timeout of "
            f"{format_duration(timeout)}; {outcome}"
        )
        self.task, self.duration, self.timeout, self.failure = task, duration, timeout, failure
        self.__cause__ = failure


class EnqueuedTooLate(TimeoutError):
    """A firing's message reached the broker only after it had expired (the publish waited on
    a broker outage): its worker will drop it, so it counts as failed, not enqueued."""

    def __init__(self, task: str, result_id: str, sent: datetime, expires: datetime) -> None:
        super().__init__(
            f"{task}: the message {result_id} reached the broker at {sent.isoformat()}, after "
            f"it expired at {expires.isoformat()}; a worker will discard it"
        )
        self.task, self.result_id, self.sent, self.expires = task, result_id, sent, expires


def current_fire_time() -> datetime | None:
    """Return the fire time the running task serves (``None`` in a manual run or outside)."""
    return _fire_time.get()


def shutdown_requested() -> bool:
    """Return whether the scheduler running the current task is shutting down."""
    stopping = _stopping.get()
    return stopping is not None and stopping()


def cancel_requested() -> bool:
    """Return whether the running task should stop: it has run past its ``timeout=``, or the
    scheduler is shutting down.

    Python cannot stop a thread from outside: a task that may run long checks this between
    steps and returns early.
    """
    deadline = _deadline.get()
    return (deadline is not None and time.monotonic() >= deadline) or shutdown_requested()


def set_firing(fire_time: datetime | None, deadline: float | None = None) -> None:
    """Make *fire_time* the current fire time, and *deadline* (on the ``time.monotonic()``
    clock) the time the run passes its timeout, in the current context: call it in a copy of
    the context that ends with the run (``contextvars.copy_context().run``), which drops both
    with it."""
    _fire_time.set(fire_time)
    _deadline.set(deadline)


@contextmanager
def stopping_context(stopping: Callable[[], bool]) -> Iterator[None]:
    """Make *stopping* answer ``shutdown_requested()`` while the block runs."""
    token = _stopping.set(stopping)
    try:
        yield
    finally:
        _stopping.reset(token)
