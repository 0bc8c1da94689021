"""The admin of the schedules kept in the database: add, edit, enable and disable them, and move
a code task to another trigger ("back to the code's schedule" moves it back).

The task and the command are offered as a choice of what the code lets schedules run
(``@schedulable``, the ``@scheduled`` tasks' functions, ``SCHEDULING['COMMANDS']``), and the
form refuses what could not run with the model's ``full_clean()``. Adding and changing need
the model's add and change permissions; staff with the view permission only see the schedules
read-only. Every change goes to the admin's log, as Django's admin writes it.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext
from django.views.decorators.http import require_POST

from ..models import Schedule
from ..tasks.registry import registry
from ..tasks.stored import FIELDS, TRIGGER_FIELDS
from .views import admin_settings, badge, format_time

__all__ = ["ScheduleAdmin", "ScheduleForm"]


class ScheduleForm(forms.ModelForm):
    """A schedule, with its task and command chosen among what the code allows."""

    class Meta:
        model = Schedule
        fields = [field for field in FIELDS if field != "error"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tasks = sorted(registry.schedulable())
        commands = sorted(admin_settings().commands)
        current = self.instance
        # A stored value that is no longer allowed stays visible, so the error can name it.
        if current.task and current.task not in tasks:
            tasks.append(current.task)
        if current.command and current.command not in commands:
            commands.append(current.command)
        none = [("", "---------")]
        self.fields["task"] = forms.ChoiceField(
            label=Schedule._meta.get_field("task").verbose_name.capitalize(),
            choices=none + [(name, name) for name in tasks],
            required=False,
            help_text=_("A task the code made @schedulable, or a @scheduled task's function."),
        )
        self.fields["command"] = forms.ChoiceField(
            label=Schedule._meta.get_field("command").verbose_name.capitalize(),
            choices=none + [(name, name) for name in commands],
            required=False,
            help_text=_("Or a management command listed in SCHEDULING['COMMANDS']."),
        )


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = ("name", "target", "trigger_text", "enabled", "problem", "updated_on")
    list_filter = ("enabled", "override")
    search_fields = ("name", "task", "command")
    readonly_fields = ("error_text", "created_at", "updated_at")
    actions = ["enable_schedules", "disable_schedules", "back_to_code"]
    fieldsets = (
        (None, {"fields": ("name", "task", "command", "override", "enabled", "error_text")}),
        (
            gettext_lazy("Trigger"),
            {
                "fields": TRIGGER_FIELDS,
                "description": gettext_lazy(
                    "Give one of cron, fixed rate or fixed delay, with the values @scheduled takes."
                ),
            },
        ),
        (gettext_lazy("Arguments"), {"fields": ("args", "kwargs")}),
        (
            gettext_lazy("Options"),
            {"fields": ("missed", "jitter", "lock_at_most_for", "lock_at_least_for")},
        ),
        (gettext_lazy("History"), {"fields": ("created_at", "updated_at")}),
    )

    class Media:
        css = {"all": ["django_scheduling/admin.css"]}

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        if obj is not None:
            return self.fieldsets
        # A new schedule has no error and no history yet.
        first, *rest, _history = self.fieldsets
        fields = [field for field in first[1]["fields"] if field != "error_text"]
        return ((first[0], {"fields": fields}), *rest)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        return super().get_queryset(request).using(admin_settings().database)

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        obj.save(using=admin_settings().database)

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        obj.delete(using=admin_settings().database)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        queryset.using(admin_settings().database).delete()

    # -- columns ---------------------------------------------------------------------------

    @admin.display(description=gettext_lazy("runs"))
    def target(self, schedule: Schedule) -> str:
        if schedule.override:
            return badge("override", _("the code's task, moved"))
        if schedule.command:
            return format_html("manage.py {}", schedule.command)
        return schedule.task

    @admin.display(description=gettext_lazy("trigger"))
    def trigger_text(self, schedule: Schedule) -> str:
        given = [
            f"{key}={getattr(schedule, key)}" for key in TRIGGER_FIELDS if getattr(schedule, key)
        ]
        return ", ".join(given) or "-"

    @admin.display(description=gettext_lazy("error"))
    def problem(self, schedule: Schedule) -> str:
        if not schedule.error:
            return "-"
        return format_html(
            '<span title="{}">{}</span>', schedule.error, badge("failed", _("cannot run"))
        )

    @admin.display(description=gettext_lazy("error"))
    def error_text(self, schedule: Schedule) -> str:
        return schedule.error or "-"

    @admin.display(description=gettext_lazy("updated at"), ordering="updated_at")
    def updated_on(self, schedule: Schedule) -> str:
        return format_time(schedule.updated_at)

    # -- actions ---------------------------------------------------------------------------

    @admin.action(description=gettext_lazy("Enable selected schedules"), permissions=["change"])
    def enable_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        count = self._set_enabled(request, queryset, enabled=True)
        self.message_user(
            request, ngettext("Enabled %d schedule.", "Enabled %d schedules.", count) % count
        )

    @admin.action(description=gettext_lazy("Disable selected schedules"), permissions=["change"])
    def disable_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        count = self._set_enabled(request, queryset, enabled=False)
        self.message_user(
            request, ngettext("Disabled %d schedule.", "Disabled %d schedules.", count) % count
        )

    @admin.action(
        description=gettext_lazy("Move the selected code tasks back to the code's schedule"),
        permissions=["delete"],
    )
    def back_to_code(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        count = self._back_to_code(request, queryset.filter(override=True))
        self.message_user(
            request,
            ngettext(
                "%d task is back on the code's schedule.",
                "%d tasks are back on the code's schedule.",
                count,
            )
            % count,
        )

    def _set_enabled(
        self, request: HttpRequest, queryset: QuerySet[Schedule], *, enabled: bool
    ) -> int:
        changed = list(queryset.using(admin_settings().database).filter(enabled=not enabled))
        for schedule in changed:
            schedule.enabled = enabled
            schedule.save(using=admin_settings().database, update_fields=["enabled", "updated_at"])
            self.log_change(request, schedule, _("Enabled.") if enabled else _("Disabled."))
        return len(changed)

    def _back_to_code(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> int:
        overrides = queryset.using(admin_settings().database).filter(override=True)
        self.log_deletions(request, overrides)
        return overrides.delete()[0]

    # -- the button on an override's page -----------------------------------------------------

    def get_urls(self) -> list:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view(self.back_to_code_view)
        return [path("<path:object_id>/back/", view, name=f"{prefix}_back"), *super().get_urls()]

    @method_decorator(require_POST)
    def back_to_code_view(self, request: HttpRequest, object_id: str) -> HttpResponseRedirect:
        # Permission before lookup, so that users without it learn nothing about the rows.
        if not self.has_delete_permission(request):
            raise PermissionDenied
        manager = Schedule.objects.using(admin_settings().database)
        schedule = get_object_or_404(manager, pk=unquote(object_id), override=True)
        self._back_to_code(request, manager.filter(pk=schedule.pk))
        self.message_user(
            request,
            _("%(name)s is back on the code's schedule; the schedulers apply it within seconds.")
            % {"name": schedule.name},
            messages.SUCCESS,
        )
        return HttpResponseRedirect(
            reverse(
                "admin:django_scheduling_scheduledtask_change",
                args=[quote(schedule.name)],
                current_app=self.admin_site.name,
            )
        )
