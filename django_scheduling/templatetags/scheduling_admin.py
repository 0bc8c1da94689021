"""Template tags of the admin pages: ``{% load scheduling_admin %}``."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils.safestring import SafeString

from ..admin_views import format_run_duration, format_run_error, overdue_count
from ..formats import format_time
from ..models import TaskRun

register = template.Library()


@register.simple_tag
def scheduling_overdue_count() -> int:
    """Return how many scheduled tasks are overdue now."""
    return overdue_count()


@register.filter
def time_with_zone(value: datetime | None) -> str:
    """Return a time as every page of the app writes it: "2026-03-29 03:00:05 CEST"."""
    return format_time(value)


@register.filter
def run_duration(value: timedelta | None) -> str:
    """Return a run's duration as "0.25s" or "1h3m20s"."""
    return format_run_duration(value)


@register.filter
def run_error(run: TaskRun) -> SafeString:
    """Return a run's error on one line, with the whole text as its tooltip."""
    return format_run_error(run)
