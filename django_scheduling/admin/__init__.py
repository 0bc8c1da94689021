"""Admin pages: the task overview (upcoming, running, overdue), the run history, the locks and
the schedules kept in the database.

The task, run and lock pages are read-only: the scheduler keeps those rows in step with the
code. Their only writes are pausing, resuming and asking for a run now (see
``admin_views.TaskControlMixin``). The schedules are edited on their own pages
(``admin.schedules``), which also move a code task to another trigger and back.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.db.models import Exists, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce, Greatest
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..models import RunStatus, Schedule, ScheduledTask, TaskLock, TaskRun, TriggerKind
from ..observability import outcomes
from ..observability.monitoring import (
    FAILING_AFTER,
    OverdueReason,
    StateAnnotations,
    TaskState,
    annotate_state,
)
from ..schedules.triggers import MISSED_COUNT_LIMIT
from .mixins import TrendsMixin
from .schedules import ScheduleAdmin

__all__ = ["ScheduleAdmin", "ScheduledTaskAdmin", "TaskLockAdmin", "TaskRunAdmin"]
from ..tasks.registry import registry
from .trends import SPARKLINE_RUNS, failures_in_a_row
from .views import (
    OVERDUE_REASON_LABELS,
    STATE_LABELS,
    TaskControlMixin,
    admin_settings,
    badge,
    breakable,
    format_instance,
    format_moment,
    format_run_duration,
    format_run_error,
    format_time,
    format_yes_no,
    start_delay,
)

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise, WithAnnotations

#: What the override badge says of a code task moved by a schedule in the database.
MOVED = "Moved from the code's schedule in the admin (Schedules)."

#: How many runs the page of a task lists.
RECENT_RUNS = 20

#: The admin home page with the overdue count; see ``show_overdue_count_on_home_page()``.
INDEX_TEMPLATE = "admin/django_scheduling/index.html"


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin that shows rows of the scheduling database and never adds, edits or deletes."""

    class Media:
        css = {"all": ["django_scheduling/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).using(admin_settings().database)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def time_column(field: str, description: StrOrPromise) -> Any:
    """Return a list/detail column showing the time *field* to the second, in the project zone."""

    @admin.display(description=description, ordering=field)
    def column(self: admin.ModelAdmin, obj: Any) -> str:
        return format_time(getattr(obj, field))

    return column


#: Overdue first: those rows need someone's attention. ``state_order`` is an annotation, which
#: ``ModelAdmin.ordering`` cannot name, hence ``get_ordering()`` and ``TaskChangeList``.
TASK_ORDERING = ("state_order", "next_fire_time", "name")


class TaskAnnotations(StateAnnotations):
    """The values that ``ScheduledTaskAdmin.get_queryset()`` adds to each task."""

    lock_holder: str | None
    lock_held_until: datetime | None
    last_success_at: datetime | None
    moved: bool


class RunAnnotations(TypedDict):
    """The value that ``TaskRunAdmin.get_queryset()`` adds to each run."""

    task_exists: bool


def last_success() -> Coalesce:
    """Return the finish of the task's newest successful run: succeeded, or enqueued (an engine
    task's run succeeds when it is enqueued; see ``trends``).

    One subquery per status, each ``ORDER BY started_at DESC LIMIT 1`` on one status: a search
    of the index on (task_name, status, started_at) that reads one row, however long the
    history. (``status IN (...)`` would sort all of the task's successful runs.)
    """
    newest = [
        Subquery(
            TaskRun.objects.filter(task_name=OuterRef("name"), status=status)
            .order_by("-started_at", "-id")
            .values("finished_at")[:1]
        )
        for status in (RunStatus.SUCCEEDED, RunStatus.ENQUEUED)
    ]
    # GREATEST() is NULL when either is NULL on SQLite and MariaDB: give it the other one.
    return Coalesce(Greatest(*newest), *newest)


class TaskChangeList(ChangeList):
    def _get_default_ordering(self) -> tuple[str, ...]:
        # Mark the columns of the real default order in the headers, not the model's.
        return TASK_ORDERING

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # The recent runs of all the tasks of the page, in one query: see TrendsMixin.
        self.model_admin.attach_recent_runs(self.result_list)  # type: ignore[attr-defined]


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        # "failing" is read from each task's recent runs, not from a column: no filter.
        return [
            (state.value, STATE_LABELS[state]) for state in TaskState if state != TaskState.FAILING
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(state=self.value()) if self.value() else queryset


@admin.register(ScheduledTask)
class ScheduledTaskAdmin(TrendsMixin, TaskControlMixin, ReadOnlyAdmin):
    list_display = ["task", "state_badge", "next_fire", "trigger_text", "last_run_summary", "lock"]
    list_display_links = ["task"]
    list_filter = [StateFilter]
    search_fields = ["name"]
    actions = ["pause_tasks", "resume_tasks", "run_tasks"]
    readonly_fields = [
        "paused_text",
        "state_badge",
        "trigger_text",
        "next_fire",
        "last_fire",
        "last_run_summary",
        "lock",
        "run_requested",
        "last_finished",
        "anchor_time",
        "removed",
        "updated",
    ]
    fieldsets = [
        (None, {"fields": [("name", "state_badge"), ("kind", "trigger_text")]}),
        (
            _("Schedule"),
            {
                "fields": [
                    ("next_fire", "last_fire"),
                    ("last_run_summary", "lock"),
                    ("paused_text", "run_requested"),
                ]
            },
        ),
        (
            _("Details"),
            {
                "fields": [("last_finished", "anchor_time"), ("removed", "updated")],
                "classes": ["collapse"],
            },
        ),
    ]
    last_fire = time_column("last_fire_time", _("last fire time claimed"))
    run_requested = time_column("run_requested_at", _("run requested at"))
    last_finished = time_column("last_finished_at", _("last finished at"))
    anchor_time = time_column("anchor", _("fixed-rate anchor"))
    removed = time_column("removed_at", _("removed from code at"))
    updated = time_column("updated_at", _("updated at"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[ScheduledTask]:
        conf, now = admin_settings(), timezone.now()
        held = TaskLock.objects.filter(name=OuterRef("name"), lock_until__gt=now)
        # Annotate before ordering: the default order sorts on the state.
        tasks = self.model._default_manager.using(conf.database)
        return (
            annotate_state(tasks, now=now, overdue_after=conf.overdue_after)
            .select_related("last_run")
            .annotate(
                lock_holder=Subquery(held.values("locked_by")[:1]),
                lock_held_until=Subquery(held.values("lock_until")[:1]),
                last_success_at=last_success(),
                # Moved by an override the schedulers apply: enabled, and without an error.
                moved=Exists(
                    Schedule.objects.filter(
                        name=OuterRef("name"), override=True, enabled=True, error=""
                    )
                ),
            )
            .order_by(*self.get_ordering(request))
        )

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        return TASK_ORDERING

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        task = super().get_object(request, object_id, from_field)
        if task is not None:  # its state reads its recent runs, as in the list
            self.attach_recent_runs([task], attribute="_state_runs")
        return task

    def failing(self, task: ScheduledTask) -> bool:
        """Return whether *task*'s last ``ALERT_AFTER_FAILURES`` (3 when not set) ended runs
        failed, read from the recent runs its row was given (``attach_recent_runs``)."""
        points = getattr(task, "_recent_runs", None) or getattr(task, "_state_runs", None)
        if not points:
            return False
        threshold = min(admin_settings().alert_after_failures or FAILING_AFTER, SPARKLINE_RUNS)
        return failures_in_a_row(points) >= threshold

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return TaskChangeList

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        name, database = unquote(object_id), admin_settings().database
        runs = TaskRun.objects.using(database).filter(task_name=name)
        context = {
            **self.trends_context(name),
            "recent_runs": runs.order_by("-started_at", "-id")[:RECENT_RUNS],
            "can_pause": self.has_pause_permission(request),
            "can_run": self.has_run_permission(request),
            # A code task is moved by a schedule in the database, and moved back by removing it.
            "override": Schedule.objects.using(database).filter(name=name, override=True).first(),
            "can_move": name in registry
            and request.user.has_perm("django_scheduling.add_schedule"),
            "can_move_back": request.user.has_perm("django_scheduling.delete_schedule"),
            "can_see_schedules": request.user.has_perm("django_scheduling.view_schedule")
            or request.user.has_perm("django_scheduling.change_schedule"),
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    @admin.display(description=_("name"), ordering="name")
    def task(self, task: ScheduledTask) -> str:
        return format_html('<span class="ds-name">{}</span>', breakable(task.name))

    @admin.display(description=_("trigger"), ordering="trigger")
    def trigger_text(self, task: ScheduledTask) -> str:
        text = task.trigger
        if task.kind == TriggerKind.ONE_SHOT and task.anchor is not None:
            # A one-shot's trigger text holds its time in ISO 8601; the anchor is that time.
            text = _("once at %(time)s") % {"time": format_time(task.anchor)}
        shown = format_html('<span class="ds-trigger">{}</span>', text)
        if getattr(task, "moved", False):
            moved = badge("override", _("override"))
            return format_html('{} <span title="{}">{}</span>', shown, _(MOVED), moved)
        return shown

    @admin.display(description=_("state"), ordering="state_order")
    def state_badge(self, task: WithAnnotations[ScheduledTask, TaskAnnotations]) -> str:
        shown = task.state
        if shown in (TaskState.UPCOMING, TaskState.DONE) and self.failing(task):
            shown = TaskState.FAILING
        state = badge(shown, STATE_LABELS[TaskState(shown)])
        if task.state == TaskState.OVERDUE and task.overdue_reason:
            reason = OVERDUE_REASON_LABELS[OverdueReason(task.overdue_reason)]
            state = format_html('{}<span class="ds-relative ds-reason">{}</span>', state, reason)
        # In the list, under the state: how the recent runs went (see TrendsMixin).
        return format_html("{}{}", state, self.recent_runs(task))

    @admin.display(description=_("next fire time"), ordering="next_fire_time")
    def next_fire(self, task: ScheduledTask) -> str:
        return format_moment(task.next_fire_time)

    @admin.display(description=_("last run"))
    def last_run_summary(self, task: ScheduledTask) -> str:
        run = task.last_run
        if run is None:
            return "-"
        return format_html(
            '<a href="{}">{}</a><span class="ds-relative">{}</span>',
            reverse(
                "admin:django_scheduling_taskrun_change",
                args=[run.pk],
                current_app=self.admin_site.name,
            ),
            badge(run.status, run.get_status_display()),
            format_run_duration(run.duration) if run.duration is not None else "",
        )

    @admin.display(description=_("lock held by"))
    def lock(self, task: WithAnnotations[ScheduledTask, TaskAnnotations]) -> str:
        if task.lock_holder is None:
            return "-"
        # The date and the time each stay whole when a narrow column wraps the line.
        date, time = format_time(task.lock_held_until).split(" ", 1)
        until = format_html(
            '<span class="ds-nowrap">{}</span> <span class="ds-nowrap">{}</span>', date, time
        )
        return format_html(
            '{}<span class="ds-relative">{}</span>',
            format_instance(task.lock_holder),
            format_html(str(_("until {}")), until),
        )

    @admin.display(description=_("paused"))
    def paused_text(self, task: ScheduledTask) -> str:
        return format_yes_no(task.paused)


class TaskNameFilter(admin.SimpleListFilter):
    title = _("task")
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        names = (
            TaskRun.objects.using(admin_settings().database)
            .order_by("task_name")
            .values_list("task_name", flat=True)
            .distinct()
        )
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(task_name=self.value()) if self.value() else queryset


@admin.register(TaskRun)
class TaskRunAdmin(ReadOnlyAdmin):
    # Compact for a laptop's width: the instance goes under the start time, the fire time it
    # served is on the run's page, and the error takes the rest of the row, on one line.
    # The status before the task: on a phone, the list shows the first columns.
    list_display = ["id", "status_badge", "task", "started_on", "duration_text", "error"]
    list_filter = [TaskNameFilter, "status", "lock_lost", "started_at"]
    show_full_result_count = False  # the history can be long; spare a COUNT(*) per page
    fields = (
        "task",
        "status_badge",
        "scheduled",
        "started",
        "finished",
        "duration_text",
        "attempt",
        "timeout_at_text",
        "missed_text",
        "instance_text",
        "lock_lost_text",
        "recovery",
        "enqueued_on",
        "error_type",
        "error_message",
        "output_text",
        "traceback_text",
    )
    readonly_fields = fields  # the history is never edited
    scheduled = time_column("scheduled_at", _("scheduled for"))
    started = time_column("started_at", _("started at"))
    finished = time_column("finished_at", _("finished at"))
    timeout_at_text = time_column("timeout_at", _("times out at"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[TaskRun]:
        task = ScheduledTask.objects.filter(name=OuterRef("task_name"))
        return super().get_queryset(request).annotate(task_exists=Exists(task))

    @admin.display(description=_("task"), ordering="task_name")
    def task(self, run: WithAnnotations[TaskRun, RunAnnotations]) -> str:
        name = format_html('<span class="ds-name">{}</span>', breakable(run.task_name))
        if not run.task_exists:
            return name
        url = reverse(
            "admin:django_scheduling_scheduledtask_change",
            args=[quote(run.task_name)],
            current_app=self.admin_site.name,
        )
        return format_html('<a href="{}">{}</a>', url, name)

    @admin.display(description=_("started at"), ordering="started_at")
    def started_on(self, run: TaskRun) -> str:
        return format_html(
            '{}<span class="ds-relative">{}</span>',
            format_time(run.started_at),
            format_instance(run.instance, prefix=str(_("on "))),
        )

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, run: TaskRun) -> str:
        status = badge(run.status, run.get_status_display())
        if run.status == RunStatus.RUNNING and run.timeout_at and run.timeout_at < timezone.now():
            # Still running, past its timeout: the scheduler cannot stop it.
            status = format_html("{} {}", status, badge("timed_out", _("timed out")))
        if run.attempt > 1:
            status = format_html(
                '{}<span class="ds-relative">{}</span>',
                status,
                _("attempt %(attempt)d") % {"attempt": run.attempt},
            )
        if not run.lock_lost:
            return status
        # Another instance may have run the task at the same time: say so where it shows.
        return format_html("{} {}", status, badge("failed", _("lock lost")))

    @admin.display(description=_("lock lost"))
    def lock_lost_text(self, run: TaskRun) -> str:
        return format_yes_no(run.lock_lost, alarm=str(_("lock lost")))

    @admin.display(description=_("instance"))
    def instance_text(self, run: TaskRun) -> str:
        return format_instance(run.instance)

    @admin.display(description=_("fire times missed before it"))
    def missed_text(self, run: TaskRun) -> str:
        if not run.missed_count:
            return "0"
        more = "+" if run.missed_count >= MISSED_COUNT_LIMIT else ""
        return format_html(
            "{}{} {}",
            run.missed_count,
            more,
            _("(coalesced into this run, or skipped, by its missed= policy)"),
        )

    @admin.display(description=_("enqueued on"))
    def enqueued_on(self, run: TaskRun) -> str:
        """Name the engine's backend and result of an enqueued run, with the outcome the
        backend reports now (read when the page renders; never raises)."""
        if not run.backend:
            return "-"
        if not run.result_id:
            return format_html("{} ({})", run.backend, _("not enqueued: the enqueue failed"))
        return format_html(
            "{} {} {}: {}",
            run.backend,
            _("as"),
            run.result_id,
            outcomes.lookup(run.backend, run.result_id),
        )

    @admin.display(description=_("recovery of"))
    def recovery(self, run: TaskRun) -> str:
        if run.recovery_of_id is None:
            return "-"
        url = reverse(
            "admin:django_scheduling_taskrun_change",
            args=[run.recovery_of_id],
            current_app=self.admin_site.name,
        )
        return format_html('<a href="{}">{}</a>', url, _("run %(id)s") % {"id": run.recovery_of_id})

    @admin.display(description=_("duration"), ordering="duration")
    def duration_text(self, run: TaskRun) -> str:
        duration = format_run_duration(run.duration)
        delay = start_delay(run)
        if delay is None:
            return duration
        # The task began this long after its recorded start: e.g. every pool thread was busy.
        return format_html(
            '{}<span class="ds-relative">{}</span>',
            duration,
            _("began %(delay)s after its start") % {"delay": format_run_duration(delay)},
        )

    @admin.display(description=_("error"))
    def error(self, run: TaskRun) -> str:
        return format_run_error(run)

    @admin.display(description=_("output"))
    def output_text(self, run: TaskRun) -> str:
        """A management command's output."""
        return _preformatted("ds-output", run.output)

    @admin.display(description=_("traceback"))
    def traceback_text(self, run: TaskRun) -> str:
        return _preformatted("ds-traceback", run.traceback)


def _preformatted(css_class: str, text: str) -> str:
    """Show *text* (the task's own, so escaped) as it was written, or "-" when empty."""
    if not text:
        return "-"
    return format_html('<pre class="{}">{}</pre>', css_class, text)


@admin.register(TaskLock)
class TaskLockAdmin(ReadOnlyAdmin):
    list_display = ["name", "locked_by", "locked", "until", "held"]
    fields = ["name", "locked_by", "locked", "until", "held"]
    readonly_fields = ["locked", "until", "held"]
    search_fields = ["name", "locked_by"]
    locked = time_column("locked_at", _("locked at"))
    until = time_column("lock_until", _("locked until"))

    @admin.display(description=_("held"))
    def held(self, lock: TaskLock) -> str:
        if lock.lock_until > timezone.now():
            return badge("held", _("held"))
        return badge("expired", _("expired"))


def show_overdue_count_on_home_page(site: admin.AdminSite) -> None:
    """Make *site*'s home page show how many tasks are overdue, unless it has its own template.

    An app's ``admin/index.html`` overrides Django's only when the app is listed above
    ``django.contrib.admin`` in ``INSTALLED_APPS``; the site's ``index_template`` works in any
    order. A site with its own index template can include
    ``admin/django_scheduling/overdue_summary.html``.
    """
    if site.index_template is None:
        site.index_template = INDEX_TEMPLATE


show_overdue_count_on_home_page(admin.site)
