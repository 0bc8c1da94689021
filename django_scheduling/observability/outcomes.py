"""Settle enqueued runs with what the engine's worker made of them.

For the scheduler, a firing of a django.tasks or Celery task ends when the engine accepts it:
its run is *enqueued*. How the worker ran it only the engine knows. Where the engine reports
results (django-tasks-db; Celery with a result backend), each scheduler asks it, every
``INTERVAL`` seconds, about the runs it enqueued in the last ``WATCH_FOR``, and records the
answer: a run its worker ran successfully becomes *succeeded*; one that failed on the worker,
or whose message the worker dropped (Celery's ``REVOKED``: it expired before a worker took
it), becomes *failed*. ``outcome`` keeps the engine's own word for it.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from datetime import datetime, timedelta

from ..clock import utcnow
from ..models import RunStatus, TaskRun
from ..tasks import engines
from . import metrics
from .deadline import OUTCOME_TIMEOUT, MissedDeadline, call_with_deadline

__all__ = ["BATCH", "INTERVAL", "WATCH_FOR", "OutcomeWatch", "lookup"]

logger = logging.getLogger(__name__)

#: How often a scheduler asks the engines, in seconds.
INTERVAL = 5.0
#: Runs enqueued longer ago than this are no longer asked about; they stay *enqueued*.
WATCH_FOR = timedelta(hours=1)
#: Runs asked about per pass, the oldest first.
BATCH = 500


class OutcomeWatch:
    """Ask the engines how the runs that instance *instance* enqueued went, and record it."""

    def __init__(
        self, *, using: str, instance: str, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.using = using
        self.instance = instance
        self.clock = clock
        self._next = 0.0

    def tick(self, monotonic: float) -> int:
        """Settle what can be settled, once per ``INTERVAL``; return how many runs were."""
        if monotonic < self._next:
            return 0
        self._next = monotonic + INTERVAL
        return self.settle(now=self.clock())

    def settle(self, *, now: datetime) -> int:
        """Ask the engines about this instance's runs still *enqueued* since ``WATCH_FOR``
        before *now*, and record the final ones; return how many."""
        pending = (
            TaskRun.objects.using(self.using)
            .filter(
                status=RunStatus.ENQUEUED,
                instance=self.instance,
                outcome="",
                started_at__gte=now - WATCH_FOR,
            )
            .exclude(result_id="")
            .order_by("started_at")
            .values_list("pk", "task_name", "backend", "result_id")[:BATCH]
        )
        by_backend: dict[str, list[tuple[int, str, str]]] = {}
        for pk, task, backend, result_id in pending:
            by_backend.setdefault(backend, []).append((pk, task, result_id))
        settled = 0
        for backend, runs in by_backend.items():
            ids = [result_id for _, _, result_id in runs]
            try:
                found = call_with_deadline(
                    functools.partial(engines.states, backend, ids), timeout=OUTCOME_TIMEOUT
                )
            except Exception as exc:  # the engine is down, slow, or cannot tell
                logger.warning("Could not ask %s how %d run(s) went: %s", backend, len(runs), exc)
                continue
            settled += self._record(runs, found)
        return settled

    def _record(self, runs: list[tuple[int, str, str]], found: dict[str, str]) -> int:
        by_state: dict[str, list[tuple[int, str]]] = {}
        for pk, task, result_id in runs:
            state = found.get(result_id)
            if state in engines.FINAL_STATES:
                by_state.setdefault(state, []).append((pk, task))
        settled = 0
        for state, settling in by_state.items():
            succeeded = engines.FINAL_STATES[state]
            changes: dict[str, object] = {
                "status": RunStatus.SUCCEEDED if succeeded else RunStatus.FAILED,
                "outcome": state.lower()[:40],
            }
            if not succeeded:
                changes["error_message"] = _failure(state)
            settled += (
                TaskRun.objects.using(self.using)
                .filter(pk__in=[pk for pk, _ in settling], status=RunStatus.ENQUEUED)
                .update(**changes)
            )
            for _, task in settling:
                metrics.worker_outcome(task, state.lower(), succeeded)
        return settled


def _failure(state: str) -> str:
    if state == "REVOKED":
        return (
            "The worker dropped the message (REVOKED): it expired before a worker took it, or "
            "it was revoked."
        )
    return f"The worker reported the run {state}."


def lookup(backend: str, result_id: str) -> str:
    """Return what the engine *backend* says of the result *result_id*, for the admin.

    Never raises, and never waits for the engine more than ``deadline.OUTCOME_TIMEOUT``
    seconds: the lookup runs on a small shared thread pool. An engine that cannot tell, fails
    to answer, or does not answer in time is said so.
    """
    lookup: Callable[[], str]
    try:
        if backend.startswith(f"{engines.DJANGO_TASKS}:"):
            alias = backend.split(":", 1)[1]
            handler = engines.task_backends()
            if alias not in handler.settings:
                return f"outcome unknown: no backend {alias!r} in TASKS"
            engine_backend = handler[alias]
            if not engine_backend.supports_get_result:
                return f"outcome not reported by backend {backend}"

            def lookup() -> str:
                return str(engine_backend.get_result(result_id).status).lower()

        elif backend == engines.CELERY:
            if "celery" not in sys.modules:
                return "outcome unknown: Celery is not loaded in this process"
            from celery import current_app
            from celery.backends.base import DisabledBackend

            # The current app is per thread: take this thread's to the pool's.
            app = current_app._get_current_object()
            if isinstance(app.backend, DisabledBackend):
                return f"outcome not reported by backend {backend} (no result backend)"

            def lookup() -> str:
                state = app.AsyncResult(result_id).state
                return "pending (or unknown to the result backend)" if state == "PENDING" else state

        else:
            return f"outcome not reported by backend {backend}"
        return call_with_deadline(lookup, timeout=OUTCOME_TIMEOUT)
    except MissedDeadline:
        logger.warning(
            "The outcome of %s on %s was not read: no answer within %g s",
            result_id,
            backend,
            OUTCOME_TIMEOUT,
        )
        return f"outcome unknown: the backend did not answer within {OUTCOME_TIMEOUT:g} s"
    except Exception as exc:
        logger.warning("Could not read the outcome of %s on %s: %s", result_id, backend, exc)
        return f"outcome unknown: {type(exc).__name__}: {exc}"
