"""Tables of the app: the lock table, the per-task state row, the run history and the
schedules kept in the database.

Models hold data only. Locking statements live in ``locking.database``; the scheduler's use of
the state row lives in ``state``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from django.db import models
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .conf import NAME_LENGTH
from .formats import format_time


class TaskLock(models.Model):
    """One row per lock name, in the style of ShedLock's ``shedlock`` table.

    Rows are never deleted: a lock is free when ``lock_until`` is not in the future. All times
    are UTC.
    """

    name = models.CharField(_("name"), max_length=NAME_LENGTH, primary_key=True)
    lock_until = models.DateTimeField(_("locked until"))
    locked_at = models.DateTimeField(_("locked at"))
    locked_by = models.CharField(_("locked by"), max_length=255)

    class Meta:
        verbose_name = _("task lock")
        verbose_name_plural = _("task locks")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TriggerKind(models.TextChoices):
    CRON = "cron", _("cron")
    FIXED_RATE = "fixed_rate", _("fixed rate")
    FIXED_DELAY = "fixed_delay", _("fixed delay")
    ONE_SHOT = "one_shot", _("one shot")


class ScheduledTask(models.Model):
    """One row per registered task: what the admin shows and what instances agree on.

    The scheduler keeps it in step with the code. ``last_fire_time`` is the newest fire time
    that an instance has claimed; a fire time is run only by the instance whose claim moved it
    forward, which is what makes each firing run once across instances. ``anchor`` fixes a
    fixed-rate task's grid and ``last_finished_at`` a fixed-delay task's next start, for every
    instance alike.
    """

    name = models.CharField(_("name"), max_length=NAME_LENGTH, primary_key=True)
    kind = models.CharField(_("kind"), max_length=20, choices=TriggerKind.choices)
    trigger = models.CharField(_("trigger"), max_length=255)
    next_fire_time = models.DateTimeField(_("next fire time"), null=True, blank=True)
    anchor = models.DateTimeField(_("fixed-rate anchor"), null=True, blank=True)
    last_fire_time = models.DateTimeField(_("last fire time claimed"), null=True, blank=True)
    last_finished_at = models.DateTimeField(_("last finished at"), null=True, blank=True)
    last_run = models.ForeignKey(
        "TaskRun",
        verbose_name=_("last run"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
        # Not indexed: every claim moves it, and only the deletion of runs reads by it (the
        # history's prune, and forgetting the start of a claim that failed: ``last_run__in``),
        # which reads this table of one row per task and updates by name. At 10,000 tasks due
        # every second on MariaDB x3 the index cost the server about 7 points of a core.
        db_index=False,
    )
    paused = models.BooleanField(_("paused"), default=False)
    recover_run = models.ForeignKey(
        "TaskRun",
        verbose_name=_("lost run to recover"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
        help_text=_("A lost run of a task with recover=True, waiting to be run again."),
    )
    run_requested_at = models.DateTimeField(
        _("run requested at"), null=True, blank=True, db_index=True
    )
    removed_at = models.DateTimeField(
        _("removed from code at"),
        null=True,
        blank=True,
        help_text=_("Set when no running scheduler declares this task any more."),
    )
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("scheduled task")
        verbose_name_plural = _("scheduled tasks")
        ordering = ["next_fire_time", "name"]
        permissions = [
            ("pause_scheduledtask", _("Can pause and resume scheduled tasks")),
            ("run_scheduledtask", _("Can run scheduled tasks now")),
        ]

    def __str__(self) -> str:
        return self.name


class RunStatus(models.TextChoices):
    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    #: Still running when a shutdown timed out.
    INTERRUPTED = "interrupted", _("interrupted")
    #: Not run: the pool's bounded queue was full.
    REJECTED = "rejected", _("rejected")
    #: Ended without a finish: its process died, froze or lost the database.
    LOST = "lost", _("lost")
    #: Handed to a task engine (django.tasks, Celery), whose workers run it.
    ENQUEUED = "enqueued", _("enqueued")
    #: Ran past its ``timeout=`` (whether it then succeeded or failed).
    TIMED_OUT = "timed_out", _("timed out")


class TaskRun(models.Model):
    """One row per run of a task, kept for ``SCHEDULING['HISTORY_RETENTION']``."""

    id = models.BigAutoField(primary_key=True)
    task_name = models.CharField(_("task"), max_length=NAME_LENGTH)
    scheduled_at = models.DateTimeField(
        _("scheduled for"),
        null=True,
        blank=True,
        help_text=_("The fire time this run served; empty for a manual run."),
    )
    started_at = models.DateTimeField(_("started at"))
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    duration = models.DurationField(_("duration"), null=True, blank=True)
    status = models.CharField(_("status"), max_length=20, choices=RunStatus.choices)
    instance = models.CharField(_("instance"), max_length=255)
    error_type = models.CharField(_("error type"), max_length=255, blank=True)
    error_message = models.TextField(_("error message"), blank=True)
    traceback = models.TextField(_("traceback"), blank=True)
    output = models.TextField(
        _("output"),
        blank=True,
        default="",
        help_text=_(
            "What a management command wrote to its stdout and stderr: the last 10 KB. Empty "
            "for other tasks."
        ),
    )
    lock_lost = models.BooleanField(
        _("lock lost"),
        default=False,
        help_text=_(
            "The run's lock expired or was taken over while it ran: another instance may have "
            "run the task at the same time."
        ),
    )
    locked_at = models.DateTimeField(
        _("lock taken at"),
        null=True,
        blank=True,
        help_text=_(
            "When the lock this run held was taken (by the lock's clock); empty without a lock."
        ),
    )
    backend = models.CharField(
        _("backend"),
        max_length=100,
        blank=True,
        # Set in the database too: runs are also inserted in bulk, by raw SQL.
        db_default="",
        help_text=_("The task engine's backend that the run was enqueued on; empty otherwise."),
    )
    result_id = models.CharField(
        _("result id"),
        max_length=255,
        blank=True,
        db_default="",
        help_text=_("The id of the enqueued run's result on its backend."),
    )
    attempt = models.PositiveSmallIntegerField(
        _("attempt"),
        default=1,
        db_default=1,
        help_text=_("1 for the first try of a fire time; 2 and up for its retries (retries=)."),
    )
    timeout_at = models.DateTimeField(
        _("times out at"),
        null=True,
        blank=True,
        help_text=_("When the run passes its timeout=; empty without a timeout."),
    )
    missed_count = models.PositiveIntegerField(
        _("fire times missed before it"),
        default=0,
        db_default=0,
        help_text=_(
            "Fire times of the schedule that passed without a run of their own just before "
            "the one this run served: coalesced into it (missed='coalesce') or skipped "
            "(missed='skip')."
        ),
    )
    outcome = models.CharField(
        _("outcome on the worker"),
        max_length=40,
        blank=True,
        db_default="",
        help_text=_(
            "For an enqueued run: how the engine's worker ran it, as its backend reports it "
            "(succeeded, failed, revoked, ...); empty while unknown."
        ),
    )
    recovery_of = models.ForeignKey(
        "self",
        verbose_name=_("recovery of"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="recoveries",
        db_constraint=False,
        help_text=_("The lost run that this run ran again (recover=True)."),
    )

    class Meta:
        verbose_name = _("task run")
        verbose_name_plural = _("task runs")
        ordering = ["-started_at", "-id"]
        get_latest_by = "started_at"
        indexes = [
            models.Index(fields=["task_name", "-started_at"], name="ds_run_task_started"),
            models.Index(fields=["status", "-started_at"], name="ds_run_status_started"),
            # The task list's last success: each task's newest run of a status, one row read.
            models.Index(
                fields=["task_name", "status", "started_at"], name="ds_run_task_status_started"
            ),
            models.Index(fields=["started_at"], name="ds_run_started"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} at {format_time(self.started_at)}"


class SchedulerInstance(models.Model):
    """One row per scheduler process: its heartbeat, written by its maintenance thread every
    ``HEARTBEAT_INTERVAL``. Rows not seen for a day are deleted by housekeeping."""

    name = models.CharField(_("name"), max_length=255, primary_key=True)
    host = models.CharField(_("host"), max_length=255)
    pid = models.PositiveIntegerField(_("process id"))
    started_at = models.DateTimeField(_("started at"))
    last_seen = models.DateTimeField(_("last seen"))
    #: Its writes waiting for the database, and those set aside (failed for good), as of its
    #: last heartbeat.
    outbox_pending = models.PositiveIntegerField(_("writes waiting"), default=0)
    outbox_set_aside = models.PositiveIntegerField(_("writes set aside"), default=0)

    class Meta:
        verbose_name = _("scheduler instance")
        verbose_name_plural = _("scheduler instances")
        ordering = ["-last_seen", "name"]

    def __str__(self) -> str:
        return self.name


class MissedChoice(models.TextChoices):
    """What a schedule does with the fire times it missed (``missed=``)."""

    COALESCE = "coalesce", _("coalesce: run once for all of them")
    SKIP = "skip", _("skip: run none of them")
    RUN_ALL = "run_all", _("run all: run each of them")


class ScheduleQuerySet(models.QuerySet):
    def update(self, **kwargs: object) -> int:
        """Update the rows, count the change in their ``revision`` (the running schedulers
        see changes by it) and set their ``updated_at``, unless the caller sets them."""
        kwargs.setdefault("revision", F("revision") + 1)
        kwargs.setdefault("updated_at", timezone.now())
        return super().update(**kwargs)

    update.alters_data = True  # type: ignore[attr-defined]


class Schedule(models.Model):
    """A schedule kept in the database: a task that the code made ``@schedulable`` (or a
    ``@scheduled`` task's function) or a command listed in ``SCHEDULING['COMMANDS']``, with a
    trigger given as text. With ``override``, the row moves the code's task of the same name
    to its trigger instead.

    Every running scheduler reads the table every ``SCHEDULES_POLL_INTERVAL`` and applies what
    changed. ``full_clean()`` (the admin's forms) refuses a row that could not run; a row
    saved without it that names anything else never runs, and ``error`` says why.
    """

    name = models.CharField(
        _("name"),
        max_length=NAME_LENGTH,
        unique=True,
        help_text=_("The task's name: in the history, the admin, the metrics and the locks."),
    )
    task = models.CharField(
        _("task"),
        max_length=255,
        blank=True,
        help_text=_("What the schedule runs: a task the code made @schedulable."),
    )
    command = models.CharField(
        _("management command"),
        max_length=100,
        blank=True,
        help_text=_("Or a management command listed in SCHEDULING['COMMANDS']."),
    )
    override = models.BooleanField(
        _("moves a code task"),
        default=False,
        help_text=_(
            "The row gives the task of the same name in the code this trigger instead of its "
            "own; it names no task or command."
        ),
    )
    cron = models.CharField(
        _("cron"),
        max_length=255,
        blank=True,
        help_text=_("Six fields with seconds, e.g. 0 0 4 * * * (04:00 every day)."),
    )
    zone = models.CharField(
        _("time zone"),
        max_length=64,
        blank=True,
        help_text=_("The cron's time zone, e.g. Europe/Paris; empty: TIME_ZONE."),
    )
    fixed_rate = models.CharField(
        _("fixed rate"), max_length=64, blank=True, help_text=_("Or a period, e.g. 15m.")
    )
    fixed_delay = models.CharField(
        _("fixed delay"),
        max_length=64,
        blank=True,
        help_text=_("Or a pause between a run's end and the next start, e.g. 30s."),
    )
    initial_delay = models.CharField(
        _("initial delay"),
        max_length=64,
        blank=True,
        help_text=_("With a fixed rate or delay: the wait before the first run."),
    )
    args = models.JSONField(_("arguments"), default=list, blank=True)
    kwargs = models.JSONField(_("keyword arguments"), default=dict, blank=True)
    enabled = models.BooleanField(_("enabled"), default=True)
    missed = models.CharField(
        _("missed runs"),
        max_length=20,
        choices=MissedChoice.choices,
        default=MissedChoice.COALESCE,
    )
    jitter = models.CharField(_("jitter"), max_length=64, blank=True)
    lock_at_most_for = models.CharField(
        _("lock at most for"), max_length=64, blank=True, help_text=_("Empty: LOCK_AT_MOST_FOR.")
    )
    lock_at_least_for = models.CharField(
        _("lock at least for"),
        max_length=64,
        blank=True,
        help_text=_("Empty: LOCK_AT_LEAST_FOR."),
    )
    error = models.TextField(
        _("error"),
        blank=True,
        default="",
        editable=False,
        help_text=_("Why the schedulers do not run this row, as they last read it."),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)
    revision = models.PositiveBigIntegerField(
        _("revision"),
        default=1,
        editable=False,
        help_text=_(
            "Counts the row's changes: each save and update adds one, in the database. The "
            "schedulers see a change by the sum of the revisions, whatever the clocks."
        ),
    )

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    #: Raises ``ValidationError`` for a row that could not run; the app sets it when it is
    #: ready (``tasks.stored.validate``, which knows the code's tasks).
    validator: ClassVar[Callable[[Schedule], None] | None] = None

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save the row, its change counted in ``revision`` by the database (two saves at once
        count two), and the revision read back."""
        if self._state.adding:
            super().save(*args, **kwargs)
            return
        self.revision = F("revision") + 1
        fields = kwargs.get("update_fields")
        if fields is not None:
            kwargs["update_fields"] = {*fields, "revision", "updated_at"}
        super().save(*args, **kwargs)
        self.refresh_from_db(fields=["revision"])

    def clean(self) -> None:
        if Schedule.validator is not None:
            Schedule.validator(self)
