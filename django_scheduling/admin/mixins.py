"""The trends in the admin: the run chart and figures on a task's page, the sparkline and last
success in the task list, and the timeline page of the next 24 hours' firings.

Read-only, and cheap: a task's page reads its last 100 runs in one query; the task list reads
the recent runs of all the tasks of the page in one query; the timeline reads the tasks in one
query and computes their firings from their triggers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta, tzinfo
from typing import TYPE_CHECKING, Any

import django
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_GET

from ..conf import SchedulingSettings
from ..formats import format_time
from ..models import ScheduledTask
from ..runtime.database_schedules import DatabaseSchedules
from ..schedules import timeline
from ..schedules.timeline import TaskPlan
from ..schedules.triggers import Trigger, TriggerState
from ..tasks import registry as registry_module
from ..tasks.definition import TaskDefinition
from ..tasks.resolved import resolve
from . import charts, trends
from .views import admin_settings, naturaltime_ago

if TYPE_CHECKING:
    from django.contrib import admin

    _TaskAdminBase = admin.ModelAdmin[ScheduledTask]
else:
    _TaskAdminBase = object

__all__ = ["TrendsMixin", "TIMELINE_MINUTES"]

#: How many of the busiest minutes the timeline page lists.
TIMELINE_MINUTES = 50
#: How many task names a minute of the timeline lists.
NAMES_PER_MINUTE = 10


class TrendsMixin(_TaskAdminBase):
    """Trends for ``ScheduledTaskAdmin``: see the module's docstring."""

    # -- the task list -------------------------------------------------------------------------

    def attach_recent_runs(
        self, tasks: Iterable[ScheduledTask], attribute: str = "_recent_runs"
    ) -> None:
        """Give each of *tasks* (a page of the list) its recent runs, read in one query, as
        its *attribute* (``_recent_runs``: the list shows them as a sparkline)."""
        tasks = list(tasks)
        found = trends.recent_runs_of(
            [task.name for task in tasks], using=admin_settings().database
        )
        now = timezone.now()
        for task in tasks:
            setattr(task, attribute, trends.run_points(found[task.name], now=now))

    def recent_runs(self, task: ScheduledTask) -> str:
        """Return the sparkline of the task's last runs and how long ago it last succeeded
        (the time itself in the tooltip), for the task list; nothing on other pages.

        The state column shows them under the state: a column of their own would make the
        list too wide for a laptop's screen.
        """
        if not hasattr(task, "_recent_runs"):
            return ""
        points = task._recent_runs
        last_success = getattr(task, "last_success_at", None)
        if not points:
            return ""
        line = charts.sparkline(points, slots=trends.SPARKLINE_RUNS)
        if last_success is None:
            success = format_html(
                '<span class="ds-relative ds-last-success">{}</span>', _("no success")
            )
        else:
            success = format_html(
                '<span class="ds-relative ds-last-success" title="{}">{}</span>',
                _("last success: %(time)s") % {"time": format_time(last_success)},
                _("✓ %(ago)s") % {"ago": naturaltime_ago(last_success)},
            )
        return format_html('<span class="ds-trend">{}{}</span>', line, success)

    # -- a task's page -------------------------------------------------------------------------

    def trends_context(self, name: str) -> dict[str, Any]:
        """Return the chart and the figures of task *name*'s last runs, for its page."""
        conf = admin_settings()
        rows = trends.recent_runs(name, using=conf.database)
        jitter = conf.jitter
        tasks = registry_module.registry
        if name in tasks and (definition := tasks.get(name)).error is None:
            jitter = resolve(definition, conf, timezone.get_default_timezone()).jitter
        late_after = trends.LATE_START + jitter
        points = trends.run_points(rows, now=timezone.now(), late_after=late_after)
        return {
            "run_chart": charts.run_chart(points) if points else None,
            "run_stats": trends.run_stats(points),
            "late_after": late_after,
            "chart_runs": trends.CHART_RUNS,
            "status_colours": [
                (status, charts.status_label(status), colour)
                for status, colour in charts.STATUS_COLOURS.items()
            ],
            "late_colour": charts.LATE_COLOUR,
        }

    # -- the timeline page ---------------------------------------------------------------------

    def get_urls(self) -> list:
        name = f"{self.opts.app_label}_{self.opts.model_name}_timeline"
        timeline_url = path("timeline/", self.admin_site.admin_view(self.timeline_view), name=name)
        return [timeline_url, *super().get_urls()]

    @method_decorator(require_GET)
    def timeline_view(self, request: HttpRequest) -> TemplateResponse:
        """Show the firings of the next 24 hours across all tasks, or of the hours before
        ``timeline.MAX_FIRINGS`` of them: the title says the span shown."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        conf = admin_settings()
        now = timezone.now()
        plans, paused = read_plans(conf=conf, default_zone=timezone.get_default_timezone())
        planned = timeline.plan_firings(plans, now=now)
        minutes, busy_minutes = timeline.busiest_minutes(planned.firings, limit=TIMELINE_MINUTES)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Timeline of the next %(span)s")
            % {"span": format_span(planned.shown_until - now)},
            "opts": self.opts,
            "timeline": planned,
            "strip": charts.timeline_strip(planned),
            "minutes": [
                (minute, minute.names[:NAMES_PER_MINUTE], len(minute.names) - NAMES_PER_MINUTE)
                for minute in minutes
            ],
            "busy_minutes": busy_minutes,
            "paused": paused,
            "capped": sorted(planned.capped.items()),
            "stopped_early": planned.complete_until is not None
            and planned.complete_until < planned.end,
            "max_per_task": timeline.MAX_FIRINGS_PER_TASK,
            "max_firings": timeline.MAX_FIRINGS,
            "timeline_minutes": TIMELINE_MINUTES,
            "breadcrumbs_as_list": django.VERSION >= (6, 1),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/django_scheduling/scheduledtask/timeline.html", context
        )


def format_span(span: timedelta) -> str:
    """Return *span* in hours and whole minutes: "24 hours", "5 hours 40 minutes", "1 minute"."""
    minutes = max(int(span.total_seconds() // 60), 1)
    hours, minutes = divmod(minutes, 60)
    parts = []
    if hours:
        parts.append(ngettext("%(count)d hour", "%(count)d hours", hours) % {"count": hours})
    if minutes:
        parts.append(
            ngettext("%(count)d minute", "%(count)d minutes", minutes) % {"count": minutes}
        )
    return " ".join(parts)


def task_plans(
    rows: Iterable[tuple[Any, ...]],
    *,
    conf: SchedulingSettings,
    default_zone: tzinfo,
    definitions: Mapping[str, TaskDefinition],
) -> list[TaskPlan]:
    """Return the plans of *rows*: (name, trigger text, anchor, last fire time, last finished
    at, next fire time) of tasks neither paused nor removed.

    The trigger comes from the task's definition in *definitions* (the code's, as the
    schedules in the database move them, and those schedules), as the scheduler builds it,
    when it is the trigger stored in the row; otherwise the task is shown at its stored next
    fire time only.
    """
    plans = []
    for name, stored, anchor, last_fire, last_finished, next_fire_time in rows:
        state = TriggerState(anchor, last_fire, last_finished)
        trigger: Trigger | None = None
        jitter = conf.jitter
        definition = definitions.get(name)
        if definition is not None and definition.error is None:
            task = resolve(definition, conf, default_zone)
            jitter = task.jitter
            if task.described == stored:
                trigger = task.trigger
        plans.append(TaskPlan(name, trigger, state, jitter, next_fire_time))
    return plans


#: The columns ``task_plans()`` reads of each task.
PLAN_FIELDS = ("name", "trigger", "anchor", "last_fire_time", "last_finished_at", "next_fire_time")


def read_plans(*, conf: SchedulingSettings, default_zone: tzinfo) -> tuple[list[TaskPlan], int]:
    """Return the plans of the tasks that fire (neither paused nor removed), in one query,
    and how many tasks are paused."""
    rows = ScheduledTask.objects.using(conf.database).filter(removed_at__isnull=True).order_by()
    active, paused = [], 0
    for paused_flag, *row in rows.values_list("paused", *PLAN_FIELDS).iterator():
        if paused_flag:
            paused += 1
        else:
            active.append(tuple(row))
    tasks = registry_module.registry
    code = [definition for definition in tasks if definition.error is None]
    found = DatabaseSchedules(tasks=tasks, conf=conf).definitions(code)
    definitions = {definition.name: definition for definition in found}
    return task_plans(active, conf=conf, default_zone=default_zone, definitions=definitions), paused
