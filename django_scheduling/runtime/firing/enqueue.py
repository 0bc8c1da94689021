"""Enqueue claimed firings on their engine (django.tasks, Celery) instead of calling them.

An engine that writes to the scheduler's database (django-tasks-db on its alias) enqueues in the
claim's transaction: the runs' records, the claims and the enqueues commit together, exactly
once. Any other engine is published after the claim commits, on a worker thread, as a call of
its own; a publish that fails is tried again, with a growing wait, until the firing's deadline.
A crash between the claim and the publish loses that fire time (its run, left "running", is
later marked lost); a publish that fails for good is a failed run, and the task fires again at
its next fire time.

A burst claimed ahead of its time is enqueued at once, to run at its time: in the claim's
transaction with django.tasks' ``run_after``, or, on Celery, published right after the claim
with the message's ``eta``. A Celery worker holds such a message until then. So a burst's
messages are on the queue when their time comes, rather than published one after another from
that moment (about half a millisecond of Python each).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from django.db import DatabaseError, transaction

from ... import signals
from ...context import EnqueuedTooLate
from ...models import RunStatus
from ...observability.events import run_events
from ...schedules.decisions import retry_delay
from ...tasks import engines
from ..calls import Done
from .contention import when
from .invoke import Underway, retry_bound
from .record import NO_ERROR, HandOver, Recorder
from .runs import Claim, ClaimedRun, Handed
from .spec import TaskSpec

__all__ = [
    "EnqueueRefused",
    "Enqueuer",
    "PUBLISH_BACKOFF",
    "PUBLISH_BACKOFF_MAX",
    "PUBLISH_RETRY_FOR",
]

logger = logging.getLogger(__name__)

#: A publish that fails is tried again after this long, doubling up to ``PUBLISH_BACKOFF_MAX``,
#: until the firing's deadline; without one (a fixed delay, a manual run), for this long.
PUBLISH_BACKOFF = timedelta(milliseconds=500)
PUBLISH_BACKOFF_MAX = timedelta(seconds=10)
PUBLISH_RETRY_FOR = timedelta(minutes=1)


class EnqueueRefused(Exception):
    """The database refused an enqueue made in the claim's transaction (its cause): the
    transaction rolls back, and the batch's firings are claimed one at a time."""


class Enqueuer(HandOver):
    """Hand claimed firings to their engine."""

    def __init__(
        self,
        *,
        using: str,
        recorder: Recorder,
        underway: Underway,
        stopping: threading.Event,
        clock: Callable[[], datetime],
    ) -> None:
        super().__init__(recorder=recorder, underway=underway, clock=clock)
        self.using = using
        self.stopping = stopping
        self._commits_with: dict[str, bool] = {}

    def commits_with(self, spec: TaskSpec) -> bool:
        """Return whether enqueuing *spec* writes in the claim's transaction (asked once per
        task: the engines' settings do not change while the scheduler runs)."""
        name = spec.name
        found = self._commits_with.get(name)
        if found is None:
            definition = spec.definition
            found = self._commits_with[name] = engines.commits_with(
                definition.func, definition.engine, self.using
            )
        return found

    def publishes_ahead(self, spec: TaskSpec) -> bool:
        """Return whether a firing of *spec* claimed ahead of its time is published at once,
        for its engine to hold until then: Celery, with the message's ``eta`` (a Celery
        enqueue never commits with the claim)."""
        return spec.definition.engine == engines.CELERY

    # -- in the claim's transaction ------------------------------------------------------------

    def enqueue_claimed(self, claims: list[Claim], started: datetime) -> None:
        """Enqueue *claims* inside the claim's transaction, and record how each went there.

        A database error is raised: the claims roll back with it, never a claim without its
        enqueue. A claim ahead of its time is enqueued to run at it (``run_after``)."""
        ends = []
        for claim in claims:
            fire_time = claim.fire_time
            ahead = claim.at is not None and claim.at > self.clock()
            run_after = claim.at if ahead else None
            handed = claim.handed = self._publish(
                claim.spec, fire_time, started, savepoint=True, run_after=run_after
            )
            if claim.run_id is not None:
                ends.append((claim.run_id, handed))
        self.recorder.record_handed(ends, started)

    # -- on a worker thread, after the claim ---------------------------------------------------

    def run(self, run: ClaimedRun, done: Done) -> None:
        """Publish the claimed *run* (unless its claim enqueued it) and hand its end to the
        recorder."""
        self.underway.started(run.spec.name)
        started = self.clock()
        spec, fire_time = run.spec, run.fire_time
        # Announced once the claim committed, also when its transaction enqueued it.
        run_events.publish(
            signals.run_started,
            spec.name,
            task=spec.definition,
            scheduled_at=fire_time,
            run=run.run_id,
        )
        if run.handed is None:
            run_after = run.run_after if run.run_after and run.run_after > started else None
            run.handed = self._publish(
                spec, fire_time, started, savepoint=False, run_after=run_after
            )
        handed = run.handed
        spec.finished(handed.finished)
        run.duration, run.exc = handed.finished - started, handed.exc
        self.recorder.finish(
            run,
            done,
            status=RunStatus(handed.status),
            started=started,
            finished=handed.finished,
            error=handed.error,
            backend=handed.backend,
            result_id=handed.result_id,
        )

    def _publish(
        self,
        spec: TaskSpec,
        fire_time: datetime | None,
        started: datetime,
        *,
        savepoint: bool,
        run_after: datetime | None = None,
    ) -> Handed:
        """Enqueue one call of the task on its engine; a failure is a failed run. Only a
        database error inside the claim's transaction (*savepoint*) is raised.

        A publish that fails is tried again, with a growing wait, until the firing's deadline:
        its next fire time (never past its message's expiry; without either, for
        ``PUBLISH_RETRY_FOR``). One that returns only after its message's expiry counts as
        failed: the worker will drop it.
        """
        definition = spec.definition
        assert definition.engine is not None
        backend = engines.backend_name(definition.func, definition.engine)
        expires = self._expires(spec, fire_time, started)
        # The firing's deadline: its next fire time, and never past its message's expiry.
        bounds = [retry_bound(spec, fire_time, started), expires]
        deadline = min([bound for bound in bounds if bound is not None], default=None)
        deadline = deadline or started + PUBLISH_RETRY_FOR
        # The time left until the deadline, spent in real time from here on.
        budget_ends = time.monotonic() + (deadline - started).total_seconds()
        attempt = 0
        while True:
            attempt += 1
            try:
                atomic = transaction.atomic(using=self.using) if savepoint else None
                with atomic or contextlib.nullcontext():
                    enqueued = engines.enqueue(
                        definition.func,
                        definition.engine,
                        definition.args,
                        definition.kwargs,
                        expires=expires,
                        time_limit=spec.timeout,
                        run_after=run_after,
                    )
                break
            except Exception as exc:  # the broker is down, the arguments do not serialize, ...
                if savepoint and isinstance(exc, DatabaseError):
                    # The claim's transaction fails with it: nothing is claimed.
                    raise EnqueueRefused(spec.name) from exc
                wait = retry_delay(attempt, PUBLISH_BACKOFF, PUBLISH_BACKOFF_MAX, random.random())
                # Never inside the claim's transaction: it would hold the task's row meanwhile.
                in_time = time.monotonic() + wait.total_seconds() < budget_ends
                if not savepoint and in_time and not self.stopping.is_set():
                    logger.warning(
                        "Could not enqueue %s (scheduled for %s) on %s: %s; trying again in %s",
                        spec.name,
                        when(fire_time),
                        backend,
                        exc,
                        f"{wait.total_seconds() * 1000:.1f} ms",
                    )
                    if not self.stopping.wait(wait.total_seconds()):
                        continue
                logger.error(
                    "Could not enqueue %s (scheduled for %s) on %s in %d attempt(s), until %s; "
                    "it fires again at its next fire time",
                    spec.name,
                    when(fire_time),
                    backend,
                    attempt,
                    deadline.isoformat(),
                    exc_info=exc,
                )
                error = (
                    f"{type(exc).__module__}.{type(exc).__qualname__}",
                    f"{exc} (in {attempt} attempt(s), until {deadline.isoformat()})",
                    traceback.format_exc(),
                )
                return Handed(RunStatus.FAILED, self.clock(), backend, "", error, exc)
        finished = self.clock()
        if expires is not None and finished > expires:
            late = EnqueuedTooLate(spec.name, enqueued.result_id, finished, expires)
            logger.error("%s", late)
            error = (f"{EnqueuedTooLate.__module__}.{EnqueuedTooLate.__qualname__}", str(late), "")
            return Handed(
                RunStatus.FAILED, finished, enqueued.backend, enqueued.result_id, error, late
            )
        logger.info(
            "Enqueued %s (scheduled for %s) on %s as %s",
            spec.name,
            when(fire_time),
            enqueued.backend,
            enqueued.result_id,
        )
        return Handed(RunStatus.ENQUEUED, finished, enqueued.backend, enqueued.result_id, NO_ERROR)

    def _expires(
        self, spec: TaskSpec, fire_time: datetime | None, started: datetime
    ) -> datetime | None:
        """Return when a Celery message of this firing expires, counted from its fire time:
        ``expires=`` after it, else at the task's next fire time (a message still waiting then
        is dropped by the worker, which runs the next one instead). A message delayed by an
        outage but still within its period is run.

        A firing sent after its next fire time had already come (a catch-up of
        ``missed="run_all"``, a recovery) gets one period from its send instead, not an expiry
        in the past; a manual run, ``expires=`` from its send. Never for fixed-delay tasks and
        manual runs without ``expires=``.
        """
        expires = spec.definition.expires
        if spec.definition.engine != engines.CELERY or expires is False:
            return None
        if isinstance(expires, timedelta):
            return (fire_time or started) + expires
        if fire_time is None or spec.trigger.kind == "fixed_delay":
            return None
        following = spec.trigger.next_fire_time(
            now=fire_time, state=replace(spec.state, last_fire_time=fire_time)
        )
        if following is None:
            return None
        if following <= started:
            return started + (following - fire_time)
        return following
