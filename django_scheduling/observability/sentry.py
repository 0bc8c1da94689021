"""Sentry Crons check-ins around each run, with ``SCHEDULING['SENTRY_CRONS'] = True`` and the
``sentry`` extra (``sentry_sdk``, initialised by the project as usual).

Each run sends ``in_progress`` when it starts and ``ok`` or ``error`` with its duration when it
ends, to the monitor named after the task (``monitor_slug()``), with a ``monitor_config``
derived from the trigger (``monitor_config()``) so that Sentry creates or updates the monitor.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import uuid
from datetime import datetime, timedelta, tzinfo
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from .. import signals
from ..conf import SchedulingSettings, get_settings
from ..schedules.cron import CronExpression
from ..schedules.triggers import CronTrigger, FixedRateTrigger, Trigger
from ..tasks.registry import TaskDefinition
from ..tasks.resolved import resolve
from .events import run_events

__all__ = ["crontab", "install", "monitor_config", "monitor_slug"]

logger = logging.getLogger(__name__)

UID = "django_scheduling.sentry_crons"
#: Sentry's interval units, the largest first, in minutes.
_UNITS = (("week", 7 * 24 * 60), ("day", 24 * 60), ("hour", 60), ("minute", 1))
#: A token of a crontab field that Sentry's crontab reads as cron does.
_PLAIN = re.compile(r"(\*|[0-9A-Za-z]{1,3}(-[0-9A-Za-z]{1,3})?)(/\d+)?")
_QUARTZ = re.compile(r"(L|LW|\d+[LW]|L-\d+)", re.IGNORECASE)

_open: dict[tuple[str, int | None, datetime | None], str] = {}
_open_lock = threading.Lock()


def install() -> None:
    """Connect the receivers that send the check-ins; they do nothing unless
    ``SCHEDULING['SENTRY_CRONS']`` is on."""
    run_events.subscribe(signals.run_started, _started, _on)
    run_events.subscribe(signals.run_succeeded, _succeeded, _on)
    run_events.subscribe(signals.run_failed, _failed, _on)
    # An engine task's check-in says that its firing was enqueued on time.
    run_events.subscribe(signals.run_enqueued, _succeeded, _on)


def _on() -> bool:
    try:
        return get_settings().sentry_crons
    except ImproperlyConfigured:
        return False  # the system checks report it


def monitor_slug(name: str) -> str:
    """Return the monitor slug of task *name*: lower case, runs of other characters than
    letters, digits, ``_`` and ``-`` made one ``-``, at most 50 characters."""
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")[:50]


def crontab(expression: CronExpression) -> str | None:
    """Return *expression* as a five-field crontab, or ``None`` when it has no such form: a
    seconds field other than ``0``, Quartz's ``L``, ``W`` and ``#``, or (in a six-field
    expression) both day fields restricted, which must then both match, where cron takes
    either."""
    fields, cron_rules = expression._split(expression.expression)
    if fields[0] != "0":
        return None
    days_of_month, days_of_week = fields[3], fields[5]
    restricted = days_of_month not in ("*", "?") and days_of_week not in ("*", "?")
    if restricted and not cron_rules:
        return None
    out = []
    for field in fields[1:]:
        field = "*" if field == "?" else field
        for token in field.split(","):
            if "#" in token or _QUARTZ.fullmatch(token) or not _PLAIN.fullmatch(token):
                return None
        out.append(field)
    return " ".join(out)


def monitor_config(definition: TaskDefinition, conf: SchedulingSettings) -> dict[str, Any] | None:
    """Return the ``monitor_config`` of *definition*, or ``None`` when Sentry has no schedule
    for its trigger (a cron expression with no crontab form, a fixed rate that is not a whole
    number of minutes, a fixed delay, a one-shot).

    - ``schedule``: a crontab for cron, an interval for fixed rate;
    - ``timezone``: the cron expression's zone (the project's ``TIME_ZONE`` by default);
    - ``checkin_margin``: ``MISFIRE_THRESHOLD`` plus the task's jitter, in whole minutes, at
      least 1: a firing may start that late and still run;
    - ``max_runtime``: the task's timeout (``timeout=``, ``TIMEOUT``), else its
      ``lock_at_most_for``, in whole minutes, at least 1.
    """
    task = resolve(definition, conf, timezone.get_default_timezone())
    trigger = task.trigger
    schedule = _schedule(trigger)
    if schedule is None:
        return None
    config: dict[str, Any] = {
        "schedule": schedule,
        "checkin_margin": _minutes(conf.misfire_threshold + task.jitter),
        "max_runtime": _minutes(task.timeout or task.applied.lock_at_most_for),
    }
    if isinstance(trigger, CronTrigger):
        config["timezone"] = _zone_name(trigger.zone)
    return config


def _schedule(trigger: Trigger) -> dict[str, Any] | None:
    if isinstance(trigger, CronTrigger):
        text = crontab(trigger.expression)
        return None if text is None else {"type": "crontab", "value": text}
    if isinstance(trigger, FixedRateTrigger):
        seconds = trigger.period.total_seconds()
        if seconds < 60 or seconds % 60:
            return None
        minutes = int(seconds // 60)
        for unit, size in _UNITS:
            if minutes % size == 0:
                return {"type": "interval", "value": minutes // size, "unit": unit}
    return None


def _minutes(delta: timedelta) -> int:
    return max(1, math.ceil(delta.total_seconds() / 60))


def _zone_name(zone: tzinfo) -> str:
    return getattr(zone, "key", None) or str(zone)


def _key(sender: str, kwargs: dict[str, Any]) -> tuple[str, int | None, datetime | None]:
    # A task never overlaps itself in one process: its name, run and fire time name the run.
    return sender, kwargs.get("run"), kwargs.get("scheduled_at")


def _started(sender: str, *, task: TaskDefinition, **kwargs: Any) -> None:
    conf = get_settings()
    if not conf.sentry_crons:
        return
    from sentry_sdk.crons import MonitorStatus, capture_checkin

    check_in_id = uuid.uuid4().hex
    with _open_lock:
        _open[_key(sender, kwargs)] = check_in_id
    capture_checkin(
        monitor_slug=monitor_slug(sender),
        check_in_id=check_in_id,
        status=MonitorStatus.IN_PROGRESS,
        monitor_config=monitor_config(task, conf),  # type: ignore[arg-type]
    )


def _ended(sender: str, ok: bool, duration: timedelta, kwargs: dict[str, Any]) -> None:
    with _open_lock:
        opened = _open.pop(_key(sender, kwargs), None)
    if opened is None:  # started while the setting was off
        return
    from sentry_sdk.crons import MonitorStatus, capture_checkin

    capture_checkin(
        monitor_slug=monitor_slug(sender),
        check_in_id=opened,
        status=MonitorStatus.OK if ok else MonitorStatus.ERROR,
        duration=duration.total_seconds(),
    )


def _succeeded(sender: str, *, duration: timedelta, **kwargs: Any) -> None:
    _ended(sender, True, duration, kwargs)


def _failed(sender: str, *, duration: timedelta, **kwargs: Any) -> None:
    _ended(sender, False, duration, kwargs)
