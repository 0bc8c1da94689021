"""Pieces of the admin pages: badges, times, and the pause / resume / run-now controls.

The admin never runs a task itself. Pausing sets ``paused``, which every scheduler reads at the
task's next firing; "run now" sets ``run_requested_at``, which the schedulers poll for and run
through the normal path (lock, history).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth import get_permission_codename
from django.contrib.humanize.templatetags.humanize import naturaltime
from django.core import checks
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator
from django.utils.timesince import timesince
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext
from django.views.decorators.http import require_POST

from ..checks import scheduler_errors
from ..conf import SchedulingSettings, get_settings
from ..formats import format_time
from ..models import ScheduledTask, TaskRun
from ..observability.monitoring import OverdueReason, TaskState, overdue_tasks
from ..process import INSTANCE_NAME
from ..schedules.durations import format_duration
from .trends import task_began

if TYPE_CHECKING:
    # The mixin is used only on a ModelAdmin of ScheduledTask, whose methods it calls.
    _TaskAdminBase = admin.ModelAdmin[ScheduledTask]
else:
    _TaskAdminBase = object

__all__ = [
    "OVERDUE_REASON_LABELS",
    "STATE_LABELS",
    "TaskControlMixin",
    "admin_settings",
    "badge",
    "breakable",
    "configuration_errors",
    "format_instance",
    "format_moment",
    "format_yes_no",
    "naturaltime_ago",
    "format_run_error",
    "format_time",
    "format_run_duration",
    "overdue_count",
]

STATE_LABELS = {
    TaskState.OVERDUE: gettext_lazy("overdue"),
    TaskState.FAILING: gettext_lazy("failing"),
    TaskState.RUNNING: gettext_lazy("running"),
    TaskState.PAUSED: gettext_lazy("paused"),
    TaskState.UPCOMING: gettext_lazy("upcoming"),
    TaskState.REMOVED: gettext_lazy("removed"),
    TaskState.DONE: gettext_lazy("done"),
}

OVERDUE_REASON_LABELS = {
    OverdueReason.NOT_STARTED: gettext_lazy("no run started"),
    OverdueReason.HUNG: gettext_lazy("a run hangs"),
    OverdueReason.TIMED_OUT: gettext_lazy("a run timed out"),
}


def admin_settings() -> SchedulingSettings:
    """Return the ``SCHEDULING`` setting, or its defaults while it is invalid.

    The pages keep working with the defaults; their banner (``configuration_errors()``) names
    the mistake.
    """
    try:
        return get_settings()
    except ImproperlyConfigured:
        return SchedulingSettings.from_dict({})


def configuration_errors(request: HttpRequest | None = None) -> list[checks.CheckMessage]:
    """Return the mistakes that keep the scheduler from starting (the app's system check
    errors), once per *request*: the result is kept on it.

    They come from ``checks.scheduler_errors()``, not from ``run_checks()``: under runserver
    the checks report them as warnings so that the site serves, and the banner must still
    show them.
    """
    cached = getattr(request, "_scheduling_configuration_errors", None)
    if cached is not None:
        return cached
    errors: list[checks.CheckMessage] = list(scheduler_errors())
    if request is not None:
        request._scheduling_configuration_errors = errors  # type: ignore[attr-defined]
    return errors


def badge(kind: str, label: object) -> SafeString:
    """Return a coloured label; *kind* is a task state, a run status or "held"/"expired"."""
    return format_html('<span class="ds-badge ds-badge--{}">{}</span>', kind, label)


def breakable(name: str) -> SafeString:
    """Return *name* escaped, with line-break opportunities after its dots and underscores.

    Task names are dotted paths that browsers cannot otherwise wrap; without these breaks a
    long name widens its column, and with ``overflow-wrap: anywhere`` it would break mid-word.
    """
    parts = re.split(r"(?<=[._])(?=.)", name)
    return format_html_join(mark_safe("<wbr>"), "{}", ((part,) for part in parts))


#: How much of an error message goes into the tooltip of its one-line summary.
ERROR_TITLE_CHARS = 1000


def format_run_error(run: TaskRun) -> SafeString:
    """Return a run's error on one line (CSS cuts it): the message, then the exception's class
    name, so that a narrow column shows what went wrong before what raised it; the whole text,
    class path included, is its tooltip."""
    if not (run.error_type or run.error_message):
        return mark_safe("")
    text = f"{run.error_type}: {run.error_message}" if run.error_type else run.error_message
    message = Truncator(run.error_message).chars(200) if run.error_message else ""
    kind = run.error_type.rpartition(".")[2] if run.error_type else ""
    if message and kind:
        summary = format_html(
            '<span class="ds-error-message">{}</span> <span class="ds-error-type">({})</span>',
            message,
            kind,
        )
    else:
        summary = format_html('<span class="ds-error-message">{}</span>', message or kind)
    return format_html(
        '<span class="ds-error ds-one-line" title="{}">{}</span>',
        Truncator(text).chars(ERROR_TITLE_CHARS),
        summary,
    )


def format_instance(name: str, prefix: str = "") -> SafeString:
    """Return an instance name (``host@ns:pid:start`` by default) so that its pid always shows:
    the host is cut with an ellipsis when the column is narrow, ``:pid`` never is; the whole
    name is the tooltip. A custom ``INSTANCE_NAME`` is shown as it is, cut at the end.

    *prefix* goes before the host ("on ").
    """
    match = INSTANCE_NAME.match(name)
    if match is None:
        host, pid = name, ""
    else:
        host, pid = match["host"].split("@", 1)[0], f":{match['pid']}"
    return format_html(
        '<span class="ds-instance" title="{}"><span class="ds-host">{}{}</span>'
        '<span class="ds-pid">{}</span></span>',
        name,
        prefix,
        host,
        pid,
    )


def format_yes_no(value: bool, *, alarm: str = "") -> SafeString:
    """Return a yes/no field of the admin's pages as words, not Django's red and green icons:
    "No" is no alarm. With *alarm*, "Yes" is a red badge saying it."""
    if value and alarm:
        return badge("failed", alarm)
    return format_html("{}", _("Yes") if value else _("No"))


def naturaltime_ago(moment: datetime) -> str:
    """Return how long ago *moment* was, in the largest unit ("3 hours"), or "just now" under
    a minute (never "0 minutes")."""
    if timezone.now() - moment < timedelta(minutes=1):
        return _("just now")
    return _("%(ago)s ago") % {"ago": timesince(moment, depth=1)}


def format_moment(moment: datetime | None) -> str:
    """Return *moment* as ``format_time`` does, followed by "3 minutes from now" or "5 minutes
    ago" (Django's ``naturaltime``, which needs no ``django.contrib.humanize`` in
    ``INSTALLED_APPS`` when called as a function)."""
    if moment is None:
        return "-"
    return format_html(
        '{}<span class="ds-relative">{}</span>', format_time(moment), naturaltime(moment)
    )


def format_run_duration(delta: timedelta | None) -> str:
    """Return a run's duration: "0.25s" under a minute, "1h3m20s" above."""
    if delta is None:
        return "-"
    if delta < timedelta(minutes=1):
        return f"{delta.total_seconds():.2f}s"
    return format_duration(timedelta(seconds=round(delta.total_seconds())))


def start_delay(run: TaskRun) -> timedelta | None:
    """Return how long after its recorded start the task of *run* began (``task_began``): the
    claim's commit and hand-over, and any wait for a pool thread. ``None`` under 10 ms (as a
    duration shows it: 0.00s)."""
    began = task_began(run.status, run.started_at, run.duration, run.finished_at)
    delay = began - run.started_at
    return delay if delay >= timedelta(milliseconds=10) else None


def overdue_count() -> int:
    """Return how many tasks are overdue now."""
    conf = admin_settings()
    return overdue_tasks(
        now=timezone.now(), overdue_after=conf.overdue_after, using=conf.database
    ).count()


class TaskControlMixin(_TaskAdminBase):
    """Pause, resume and "run now" for ``ScheduledTaskAdmin``.

    Each control is an admin action on the change list and a POST-only view behind a button on
    the task's page. Pause and resume need ``pause_scheduledtask``, run now ``run_scheduledtask``.
    """

    def has_pause_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return self._has_custom_permission(request, "pause")

    def has_run_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return self._has_custom_permission(request, "run")

    def _has_custom_permission(self, request: HttpRequest, action: str) -> bool:
        codename = get_permission_codename(action, self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    # -- changelist actions --------------------------------------------------------------------

    @admin.action(description=gettext_lazy("Pause selected tasks"), permissions=["pause"])
    def pause_tasks(self, request: HttpRequest, queryset: QuerySet[ScheduledTask]) -> None:
        count = self._set_paused(request, _names(queryset), paused=True)
        self.message_user(
            request,
            ngettext("Paused %d task.", "Paused %d tasks.", count) % count,
            messages.SUCCESS,
        )

    @admin.action(description=gettext_lazy("Resume selected tasks"), permissions=["pause"])
    def resume_tasks(self, request: HttpRequest, queryset: QuerySet[ScheduledTask]) -> None:
        count = self._set_paused(request, _names(queryset), paused=False)
        self.message_user(
            request,
            ngettext("Resumed %d task.", "Resumed %d tasks.", count) % count,
            messages.SUCCESS,
        )

    @admin.action(description=gettext_lazy("Run selected tasks now"), permissions=["run"])
    def run_tasks(self, request: HttpRequest, queryset: QuerySet[ScheduledTask]) -> None:
        count = self._request_run(request, _names(queryset))
        self.message_user(
            request,
            ngettext(
                "Requested a run of %d task; a running scheduler starts it within seconds.",
                "Requested a run of %d tasks; a running scheduler starts them within seconds.",
                count,
            )
            % count,
            messages.SUCCESS,
        )

    # -- the buttons on a task's page ----------------------------------------------------------

    def get_urls(self) -> list:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/pause/", wrap(self.pause_view), name=f"{prefix}_pause"),
            path("<path:object_id>/resume/", wrap(self.resume_view), name=f"{prefix}_resume"),
            path("<path:object_id>/run/", wrap(self.run_view), name=f"{prefix}_run"),
            *super().get_urls(),
        ]

    @method_decorator(require_POST)
    def pause_view(self, request: HttpRequest, object_id: str) -> HttpResponseRedirect:
        return self._control(request, object_id, self.has_pause_permission, self._pause)

    @method_decorator(require_POST)
    def resume_view(self, request: HttpRequest, object_id: str) -> HttpResponseRedirect:
        return self._control(request, object_id, self.has_pause_permission, self._resume)

    @method_decorator(require_POST)
    def run_view(self, request: HttpRequest, object_id: str) -> HttpResponseRedirect:
        return self._control(request, object_id, self.has_run_permission, self._run)

    def _control(
        self,
        request: HttpRequest,
        object_id: str,
        allowed: Callable[[HttpRequest], bool],
        apply: Callable[[HttpRequest, ScheduledTask], tuple[int, str]],
    ) -> HttpResponseRedirect:
        # Permission before lookup, so that users without it learn nothing about which tasks exist.
        if not allowed(request):
            raise PermissionDenied
        manager = ScheduledTask.objects.using(admin_settings().database)
        task = get_object_or_404(manager, pk=unquote(object_id))
        level, message = apply(request, task)
        self.message_user(request, message, level)
        change_url = reverse(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_change",
            args=[quote(task.pk)],
            current_app=self.admin_site.name,
        )
        return HttpResponseRedirect(change_url)

    def _pause(self, request: HttpRequest, task: ScheduledTask) -> tuple[int, str]:
        if not self._set_paused(request, [task.pk], paused=True):
            return messages.INFO, _("%(name)s was already paused.") % {"name": task.pk}
        return messages.SUCCESS, _(
            "Paused %(name)s: schedulers skip its firings until it is resumed."
        ) % {"name": task.pk}

    def _resume(self, request: HttpRequest, task: ScheduledTask) -> tuple[int, str]:
        if not self._set_paused(request, [task.pk], paused=False):
            return messages.INFO, _("%(name)s was not paused.") % {"name": task.pk}
        return messages.SUCCESS, _("Resumed %(name)s.") % {"name": task.pk}

    def _run(self, request: HttpRequest, task: ScheduledTask) -> tuple[int, str]:
        if task.removed_at is not None:
            return messages.WARNING, _(
                "%(name)s is no longer declared by any running scheduler, so it cannot run."
            ) % {"name": task.pk}
        if not self._request_run(request, [task.pk]):
            return messages.INFO, _("A run of %(name)s is already requested.") % {"name": task.pk}
        return messages.SUCCESS, _(
            "Requested a run of %(name)s now; a running scheduler starts it within seconds."
        ) % {"name": task.pk}

    # -- the writes, shared by actions and views -----------------------------------------------

    def _set_paused(self, request: HttpRequest, names: Iterable[str], *, paused: bool) -> int:
        """Pause or resume the tasks *names*; log and return how many changed."""
        manager = ScheduledTask.objects.using(admin_settings().database)
        to_change = manager.filter(pk__in=list(names), paused=not paused)
        tasks = list(to_change)
        changed = to_change.update(paused=paused)
        for task in tasks:
            self.log_change(request, task, _("Paused.") if paused else _("Resumed."))
        return changed

    def _request_run(self, request: HttpRequest, names: Iterable[str]) -> int:
        """Ask the schedulers to run the tasks *names* now; log and return how many were asked.

        Removed tasks and tasks with a request still pending are left alone.
        """
        manager = ScheduledTask.objects.using(admin_settings().database)
        to_request = manager.filter(
            pk__in=list(names), run_requested_at__isnull=True, removed_at__isnull=True
        )
        tasks = list(to_request)
        changed = to_request.update(run_requested_at=timezone.now())
        for task in tasks:
            self.log_change(request, task, _("Requested a run now."))
        return changed


def _names(queryset: QuerySet[ScheduledTask]) -> list[str]:
    # Plain names: the change list's queryset carries annotations and joins that an UPDATE
    # should not repeat (MySQL refuses to update a table it also selects from).
    return list(queryset.values_list("pk", flat=True))
