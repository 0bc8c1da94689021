"""``manage.py scheduling_status``: the health check for overdue tasks."""

import json
import os
import subprocess
import sys
from datetime import timedelta
from io import StringIO

from django.core.management import CommandError, call_command
from django.test import TestCase, override_settings
from django.utils import timezone

from django_scheduling.models import ScheduledTask

TRIGGER = "cron 0 0 3 * * *"


def status(*args: str) -> tuple[int, str]:
    """Run the command; return its exit status and what it printed."""
    out = StringIO()
    try:
        call_command("scheduling_status", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


@override_settings(SCHEDULING={"OVERDUE_AFTER": "5m", "AUTOSTART": False})
class SchedulingStatusTests(TestCase):
    def setUp(self):
        self.now = timezone.now()

    def add(self, name: str, late: timedelta, **fields) -> ScheduledTask:
        return ScheduledTask.objects.create(
            name=name,
            kind="cron",
            trigger=TRIGGER,
            next_fire_time=self.now - late,
            **fields,
        )

    def test_no_overdue_tasks(self):
        self.add("on.time", timedelta(minutes=4))
        self.add("paused", timedelta(hours=1), paused=True)
        self.add("removed", timedelta(hours=1), removed_at=self.now)

        self.assertEqual(status(), (0, "No overdue tasks.\n"))

    def test_lists_the_overdue_tasks_and_fails(self):
        self.add("on.time", timedelta(minutes=4))
        self.add("nightly.backup", timedelta(minutes=30, seconds=10))
        self.add("hourly.sync", timedelta(minutes=6))

        code, output = status()

        self.assertEqual(code, 1)
        lines = output.splitlines()
        self.assertEqual(len(lines), 2)
        # The latest first, with why it is overdue: no run started for it.
        self.assertTrue(lines[0].startswith("nightly.backup  not started  due "), lines[0])
        self.assertIn("late by 30m1", lines[0])
        self.assertTrue(lines[1].startswith("hourly.sync  not started  due "))
        self.assertIn(TRIGGER, lines[1])
        self.assertNotIn("on.time", output)

    def test_error_message_counts_the_tasks(self):
        self.add("hourly.sync", timedelta(minutes=6))

        with self.assertRaisesMessage(CommandError, "1 overdue task(s) (late by more than 5m)"):
            call_command("scheduling_status", stdout=StringIO())

    @override_settings(TIME_ZONE="America/New_York")
    def test_fire_times_in_the_project_time_zone(self):
        task = self.add("hourly.sync", timedelta(minutes=6))

        _code, output = status()

        local = timezone.localtime(task.next_fire_time).isoformat(timespec="seconds")
        self.assertIn(f"due {local}", output)
        self.assertRegex(local, r"-0[45]:00$")

    def test_overdue_after_option(self):
        self.add("hourly.sync", timedelta(minutes=6))

        self.assertEqual(status("--overdue-after", "10m")[0], 0)
        self.assertEqual(status("--overdue-after", "PT2M")[0], 1)

    def test_invalid_overdue_after(self):
        cases = {
            "soon": "invalid --overdue-after 'soon'",
            "0s": "--overdue-after must be positive, got '0s'",
            "0": "--overdue-after must be positive, got '0'",
            "-5": "--overdue-after must be positive, got '-5'",
            "-5m": "--overdue-after must be positive, got '-5m'",
        }
        for value, message in cases.items():
            with self.subTest(value), self.assertRaises(CommandError) as caught:
                call_command("scheduling_status", f"--overdue-after={value}", stdout=StringIO())
            self.assertEqual(caught.exception.returncode, 2)
            self.assertEqual(str(caught.exception).partition(":")[0], message)

    def test_overdue_after_in_seconds(self):
        self.add("hourly.sync", timedelta(minutes=6))

        self.assertEqual(status("--overdue-after", "600")[0], 0)
        self.assertEqual(status("--overdue-after", "90.5")[0], 1)

    @override_settings(SCHEDULING={"CORE_POOL_SIZ": 4, "OVERDUE_AFTER": "late"})
    def test_a_bad_setting_fails_and_names_every_problem(self):
        with self.assertRaises(CommandError) as caught:
            call_command("scheduling_status", stdout=StringIO())
        self.assertEqual(caught.exception.returncode, 1)
        message = str(caught.exception)
        self.assertTrue(message.startswith("The scheduler cannot start"), message)
        self.assertIn(
            "(django_scheduling.E004) SCHEDULING has an unknown key 'CORE_POOL_SIZ'", message
        )
        self.assertIn(
            "(django_scheduling.E004) invalid SCHEDULING['OVERDUE_AFTER'] 'late'", message
        )

    @override_settings(SCHEDULING=["not", "a", "dict"])
    def test_a_bad_setting_in_json(self):
        out = StringIO()
        with self.assertRaises(CommandError):
            call_command("scheduling_status", "--json", stdout=out)
        report = json.loads(out.getvalue())
        self.assertEqual(report["ok"], False)
        [problem] = report["problems"]
        self.assertEqual(problem["id"], "django_scheduling.E004")
        self.assertIn("SCHEDULING must be a dict", problem["message"])

    def test_json(self):
        self.add("hourly.sync", timedelta(minutes=6))

        code, output = status("--json")

        self.assertEqual(code, 1)
        report = json.loads(output)
        self.assertEqual(report["ok"], False)
        self.assertEqual(report["overdue_after_seconds"], 300)
        [task] = report["overdue"]
        self.assertEqual(task["name"], "hourly.sync")
        self.assertEqual(task["trigger"], TRIGGER)
        self.assertGreaterEqual(task["late_seconds"], 360)
        self.assertLess(task["late_seconds"], 420)

    def test_json_when_all_is_well(self):
        code, output = status("--json")

        self.assertEqual(code, 0)
        self.assertEqual(json.loads(output)["overdue"], [])
        self.assertTrue(json.loads(output)["ok"])


class ExitStatusTests(TestCase):
    def test_manage_py_exit_status(self):
        # CommandError's returncode is what a health check sees from the process.
        result = subprocess.run(
            [sys.executable, "-m", "django", "scheduling_status", "--overdue-after", "nonsense"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        )

        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("invalid --overdue-after 'nonsense'", result.stderr)
