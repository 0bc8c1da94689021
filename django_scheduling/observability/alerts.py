"""Failure alerts: the ``task_failing`` signal, and optionally a mail to ``ADMINS``.

With ``SCHEDULING['ALERT_AFTER_FAILURES'] = N``, ``task_failing`` is sent once when a task's
N-th failure in a row ends, with ``recovered=False``, and once when the first success after such
a streak ends, with ``recovered=True``. Failures in a row are counted from the run history
(the newest finished runs of the task, succeeded or failed, whichever instance ran them), so
the count survives restarts and spans instances. With ``HISTORY: False`` each process counts
its own runs in memory.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q, Subquery

from .. import signals
from ..conf import get_settings
from ..models import RunStatus, TaskRun
from .events import run_events

__all__ = ["install", "failures_in_a_row"]

logger = logging.getLogger(__name__)

_counts: dict[str, int] = {}  # with the history off: failures in a row, per task
_counts_lock = threading.Lock()
UID = "django_scheduling.alerts"


def install() -> None:
    """Connect the observers that send ``task_failing`` (and mail ``ADMINS``); they hear the
    runs only while ``ALERT_AFTER_FAILURES`` is set."""
    run_events.subscribe(signals.run_failed, _failed, _on)
    run_events.subscribe(signals.run_succeeded, _succeeded, _on)
    run_events.subscribe(signals.run_enqueued, _succeeded, _on)  # an enqueue that worked
    run_events.subscribe(signals.task_failing, _mail_admins)


def _on() -> bool:
    try:
        return get_settings().alert_after_failures is not None
    except ImproperlyConfigured:
        return False  # the system checks report it


def failures_in_a_row(
    name: str,
    *,
    before: int | None = None,
    through: int | None = None,
    limit: int,
    using: str,
) -> int:
    """Return how many of the newest finished runs of *name* failed in a row, counting at most
    *limit*; with *before* (a run id), only runs older than that run count, and with *through*,
    that run and older ones. An event is delivered after its run is recorded, and later runs
    of the task may be recorded by then: they must not break the streak it reports."""
    counted = [RunStatus.SUCCEEDED, RunStatus.ENQUEUED, RunStatus.FAILED, RunStatus.TIMED_OUT]
    runs = TaskRun.objects.using(using).filter(task_name=name, status__in=counted)
    anchor = before if before is not None else through
    if anchor is not None:
        # Older in the order counted below: by start, then by id.
        started = Subquery(TaskRun.objects.using(using).filter(pk=anchor).values("started_at")[:1])
        older = Q(started_at__lt=started) | Q(started_at=started, pk__lt=anchor)
        runs = runs.filter(older if before is not None else older | Q(pk=anchor))
    statuses = runs.order_by("-started_at", "-id").values_list("status", flat=True)[:limit]
    count = 0
    for status in statuses:
        if status not in (RunStatus.FAILED, RunStatus.TIMED_OUT):
            break
        count += 1
    return count


def _failed(
    sender: str, *, task: Any, run: int | None, exception: BaseException, **kwargs: Any
) -> None:
    conf = get_settings()
    threshold = conf.alert_after_failures
    if threshold is None:
        return
    if conf.history and run is not None:
        # This run is recorded already: it ends the streak.
        count = failures_in_a_row(sender, through=run, limit=threshold + 1, using=conf.database)
    else:
        with _counts_lock:
            count = _counts[sender] = _counts.get(sender, 0) + 1
    if count == threshold:
        logger.error("Task %s has failed %d times in a row", sender, count)
        _send(sender, task=task, failures=count, recovered=False, run=run, exception=exception)


def _succeeded(sender: str, *, task: Any, run: int | None, **kwargs: Any) -> None:
    conf = get_settings()
    threshold = conf.alert_after_failures
    if threshold is None:
        return
    if conf.history and run is not None:
        count = failures_in_a_row(sender, before=run, limit=threshold, using=conf.database)
        if count >= threshold:  # the whole streak, for the receivers
            count = failures_in_a_row(sender, before=run, limit=10_000, using=conf.database)
    else:
        with _counts_lock:
            count = _counts.pop(sender, 0)
    if count >= threshold:
        logger.warning("Task %s has recovered after %d failures in a row", sender, count)
        _send(sender, task=task, failures=count, recovered=True, run=run, exception=None)


def _send(sender: str, **kwargs: Any) -> None:
    run_events.publish(signals.task_failing, sender, **kwargs)


def _mail_admins(
    sender: str, *, failures: int, recovered: bool, run: int | None, exception: Any, **kwargs: Any
) -> None:
    if not get_settings().alert_mail_admins:
        return
    if recovered:
        subject = f"Scheduled task {sender} has recovered after {failures} failures in a row"
        lines = [f"Run {run} of {sender} succeeded."]
    else:
        subject = f"Scheduled task {sender} has failed {failures} times in a row"
        lines = [f"Run {run} of {sender} failed: {type(exception).__name__}: {exception}"]
    lines.append(f"Sent at {datetime.now().astimezone().isoformat(timespec='seconds')}.")
    # Off the events thread: a slow mail server must not hold up the other observers.
    threading.Thread(
        target=_deliver, args=(subject, "\n".join(lines)), name="scheduling-alert", daemon=True
    ).start()


def _deliver(subject: str, message: str) -> None:
    from django.core.mail import mail_admins

    try:
        mail_admins(subject, message)
    except Exception:
        logger.exception("Could not mail the alert %r to ADMINS", subject)
