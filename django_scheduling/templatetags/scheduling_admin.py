"""Template tags of the admin pages: ``{% load scheduling_admin %}``."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.core.checks import CheckMessage
from django.utils.safestring import SafeString

from ..admin.views import (
    configuration_errors,
    format_instance,
    format_run_duration,
    format_run_error,
    overdue_count,
)
from ..formats import format_time
from ..models import TaskRun

register = template.Library()


@register.simple_tag
def scheduling_overdue_count() -> int:
    """Return how many scheduled tasks are overdue now."""
    return overdue_count()


@register.simple_tag(takes_context=True)
def scheduling_configuration_errors(context: template.Context) -> list[CheckMessage]:
    """Return the errors that keep the scheduler from starting, for users who may see the app."""
    request = getattr(context, "request", None)
    if request is None or not request.user.has_module_perms("django_scheduling"):
        return []
    return configuration_errors(request)


@register.filter
def time_with_zone(value: datetime | None) -> str:
    """Return a time as every page of the app writes it: "2026-03-29 03:00:05 CEST"."""
    return format_time(value)


@register.filter
def run_duration(value: timedelta | None) -> str:
    """Return a run's duration as "0.25s" or "1h3m20s"."""
    return format_run_duration(value)


@register.filter
def instance(name: str, prefix: str = "") -> SafeString:
    """Return an instance name with its pid always visible (``format_instance``)."""
    return format_instance(name, prefix)


@register.filter
def run_error(run: TaskRun) -> SafeString:
    """Return a run's error on one line, with the whole text as its tooltip."""
    return format_run_error(run)
