"""Schedules from settings, management commands and schedules in the database, with three real
``runscheduler`` processes on one database: each fire time runs once, and a schedule created,
changed, disabled or deleted while they run takes effect within the poll interval.

The scheduled work records the fire time it serves (``Execution``, one row per call), so the
checks look at what ran, not at the scheduler's bookkeeping.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client, TransactionTestCase, override_settings

from django_scheduling.models import Schedule, ScheduledTask, TaskRun
from django_scheduling.tasks.registry import TaskRegistry

from .processes import Process, poll, process_env, start_schedulers
from .test_admin_schedules import ADD_URL, back_url, form_data, nightly, use_code_tasks
from .testapp.models import Execution
from .testapp.tasks import record_stored

# Every database on Django 6.1 (the subject is the processes and the database).
pytestmark = [pytest.mark.processes, pytest.mark.sessions("6.1")]

#: How often the schedulers read the table here.
INTERVAL = 1.0
#: A change is in effect on every instance this long after it is written: the interval, a
#: maintenance pass, and a firing of a task due every second.
IN_EFFECT = timedelta(seconds=INTERVAL + 2)
SETTINGS_SCHEDULE = {
    "settings.command": {
        "command": "record_execution",
        "args": ["settings.command"],
        "fixed_rate": "1s",
    },
    "settings.task": {
        "task": "tests.testapp.tasks.record_stored",
        "args": ["settings.task"],
        "fixed_rate": "1s",
    },
}


def ran(label: str, after: datetime | None = None) -> list[datetime]:
    """Return the fire times that *label* served, after *after* if given."""
    calls = Execution.objects.filter(task=label)
    if after is not None:
        calls = calls.filter(fire_time__gt=after)
    return list(calls.order_by("fire_time").values_list("fire_time", flat=True))


@override_settings(SCHEDULING={"COMMANDS": ["record_execution"]})
class DatabaseScheduleProcessTests(TransactionTestCase):
    def start(self, count: int, **scheduling) -> list[Process]:
        env = process_env(
            TESTAPP_TASKS="",
            TESTAPP_STORED="1",
            SCHEDULING_LOG_LEVEL="INFO",
            SCHEDULING_EXTRA=json.dumps(scheduling),
        )
        return start_schedulers(self, count, env)

    def setUp(self):
        # The admin of this process knows the code task that the schedulers declare
        # (TESTAPP_STORED) and what they may run.
        tasks = TaskRegistry()
        tasks.add(nightly, cron="0 0 0 1 1 *", name="movable")
        tasks.allow(record_stored, "record")
        use_code_tasks(self, tasks)
        self.admin = Client()
        self.admin.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))

    def output(self, processes: list[Process]) -> str:
        return "\n---\n".join(process.output for process in processes)

    def test_every_kind_of_schedule_runs_once_and_changes_apply_while_running(self):
        marker = Path(tempfile.mkdtemp()) / "os-system-ran"
        Schedule.objects.create(name="db.task", task="record", args=["db.task"], fixed_rate="1s")
        Schedule.objects.create(
            name="db.command", command="record_execution", args=["db.command"], fixed_rate="1s"
        )
        # Saved without validation: rows that name what the code did not opt in.
        Schedule.objects.create(
            name="evil.system", task="os.system", args=[f"touch {marker}"], fixed_rate="1s"
        )
        Schedule.objects.create(
            name="evil.flush", command="flush", kwargs={"interactive": False}, fixed_rate="1s"
        )
        processes = self.start(
            3,
            SCHEDULE=SETTINGS_SCHEDULE,
            COMMANDS=["record_execution"],
            SCHEDULES_POLL_INTERVAL=f"{INTERVAL}s",
        )
        labels = ["settings.command", "settings.task", "db.task", "db.command"]
        poll(
            lambda: all(len(ran(label)) >= 3 for label in labels),
            timeout=60,
            message=f"not every schedule ran 3 times:\n{self.output(processes)}",
        )

        # Created while they run: it runs within the interval.
        Schedule.objects.create(
            name="db.created", task="record", args=["db.created"], fixed_rate="1s"
        )
        # The code task moved in the admin, as an operator would.
        response = self.admin.post(
            ADD_URL, form_data(name="movable", override="on", fixed_rate="1s")
        )
        self.assertEqual(response.status_code, 302, response.content.decode()[-3000:])
        poll(
            lambda: ran("db.created") and ran("movable"),
            timeout=(IN_EFFECT + timedelta(seconds=1)).total_seconds(),
            message="a created schedule or an override did not run within the interval",
        )

        # Changed: the new trigger from the moment it is in effect.
        changed = datetime.now(UTC)
        Schedule.objects.filter(name="db.task").update(fixed_rate="", cron="*/2 * * * * *")
        poll(lambda: len(ran("db.task", after=changed + IN_EFFECT)) >= 2, timeout=20)
        late = ran("db.task", after=changed + IN_EFFECT)
        self.assertEqual([t for t in late if t.second % 2], [], "the old trigger still fired")

        # Disabled, deleted, moved back: no firing once the change is in effect.
        stopped = datetime.now(UTC)
        Schedule.objects.filter(name="db.command").update(enabled=False)
        Schedule.objects.filter(name="db.created").delete()
        override = Schedule.objects.get(name="movable")
        self.assertEqual(self.admin.post(back_url(override)).status_code, 302)
        poll(lambda: len(ran("settings.task", after=stopped + IN_EFFECT)) >= 2, timeout=20)
        for label in ("db.command", "db.created", "movable"):
            self.assertEqual(ran(label, after=stopped + IN_EFFECT), [], f"{label} still ran")

        for process in processes:
            self.assertEqual(process.stop(), 0, process.output)
        for label in [*labels, "db.created", "movable"]:
            times = ran(label)
            twice = [t for t, n in Counter(times).items() if n > 1]
            self.assertEqual(twice, [], f"{label} ran these fire times more than once")
        # The moved code task was back on its yearly schedule: its row says so.
        self.assertEqual(ScheduledTask.objects.get(name="movable").trigger, "cron 0 0 0 1 1 * UTC")
        self.assertIsNotNone(ScheduledTask.objects.get(name="db.command").removed_at)

        # What was not opted in never ran, and its row says why.
        self.assertFalse(marker.exists(), "os.system ran")
        self.assertFalse(TaskRun.objects.filter(task_name__startswith="evil.").exists())
        self.assertTrue(Schedule.objects.filter(name="evil.flush").exists(), "flush ran")
        self.assertIn("is not schedulable", Schedule.objects.get(name="evil.system").error)
        self.assertIn("SCHEDULING['COMMANDS']", Schedule.objects.get(name="evil.flush").error)
