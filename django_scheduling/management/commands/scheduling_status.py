"""``manage.py scheduling_status``: list the overdue tasks; exit with status 1 if there are any.

Made for health checks and monitoring: status 0 means every task fired on time (or is paused,
removed or done), status 1 that at least one task is late or that a mistake in the tasks or
settings stops the scheduler (what ``manage.py check`` reports), status 2 a wrong option.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ...checks import describe, scheduler_errors
from ...conf import get_settings
from ...models import ScheduledTask
from ...observability.health import due_at, report
from ...observability.monitoring import overdue_tasks
from ...schedules.durations import format_duration, parse_duration


class Command(BaseCommand):
    help = (
        "List the overdue scheduled tasks and exit with status 1 if there are any, 0 otherwise. "
        "A task is overdue when its next fire time is more than SCHEDULING['OVERDUE_AFTER'] "
        "in the past and no run has started for it or a run still holds it (hung), or when a "
        "run has passed its timeout. Mistakes in the tasks or settings that stop the scheduler "
        "also exit with status 1."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--overdue-after",
            metavar="DURATION",
            help='How late a task may be before it counts as overdue: seconds ("90"), "5m" or '
            "\"PT10M\" (default: SCHEDULING['OVERDUE_AFTER']).",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the result as one JSON object: the body of the health endpoint.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        errors = scheduler_errors()
        if errors:
            if options["json"]:
                problems = [{"id": error.id, "message": error.msg} for error in errors]
                failed = {"ok": False, "configuration_errors": len(errors), "problems": problems}
                self.stdout.write(json.dumps(failed))
            raise CommandError(
                "The scheduler cannot start; fix these first (manage.py check shows them "
                "too):\n" + describe(errors),
                returncode=1,
            )
        conf = get_settings()
        overdue_after = conf.overdue_after
        if options["overdue_after"] is not None:
            overdue_after = _overdue_after(options["overdue_after"])
        now = timezone.now()
        if options["json"]:
            body = report(
                now=now,
                overdue_after=overdue_after,
                heartbeat_interval=conf.heartbeat_interval,
                using=conf.database,
            )
            self.stdout.write(json.dumps(body))
            overdue = body["overdue_count"]
        else:
            tasks = list(overdue_tasks(now=now, overdue_after=overdue_after, using=conf.database))
            for task in tasks:
                self.stdout.write(
                    f"{task.name}  {task.overdue_reason}  due {_local(due_at(task))}  "
                    f"late by {_late(task, now=now)}  ({task.trigger})"
                )
            if not tasks:
                self.stdout.write("No overdue tasks.")
            overdue = len(tasks)
        if overdue:
            limit = format_duration(overdue_after)
            raise CommandError(
                f"{overdue} overdue task(s) (late by more than {limit})", returncode=1
            )


def _overdue_after(text: str) -> timedelta:
    """Read the option's value: a duration, or on the command line also a bare number of
    seconds."""
    value: str | float = text
    if re.fullmatch(r"\s*-?\d+(\.\d+)?\s*", text):
        value = float(text)
    try:
        delta = parse_duration(value, name="--overdue-after", allow_zero=False)
    except ValueError as exc:
        # Quote the value as it was typed, not as the number it was read as.
        message = str(exc).replace(f"got {value!r}", f"got {text!r}")
        raise CommandError(message, returncode=2) from None
    return delta


def _local(moment: datetime | None) -> str:
    if moment is None:
        return "never"
    return timezone.localtime(moment).isoformat(timespec="seconds")


def _late(task: ScheduledTask, *, now: datetime) -> str:
    due = due_at(task)
    late = timedelta(0) if due is None else max(now - due, timedelta(0))
    return format_duration(timedelta(seconds=round(late.total_seconds())))
