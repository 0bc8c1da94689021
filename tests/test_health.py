"""The health endpoint (``scheduling/health/``), the heartbeats of scheduler instances and the
report that ``scheduling_status --json`` shares with the endpoint."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import TestCase, TransactionTestCase, override_settings
from django.urls import reverse

from django_scheduling.conf import InvalidSettings, SchedulingSettings
from django_scheduling.health import beat, forget_old_instances, report
from django_scheduling.models import ScheduledTask, SchedulerInstance

from .processes import manage, poll, process_env

NOW = datetime(2026, 5, 13, 12, 0, tzinfo=UTC)
URL = "/scheduling/health/"


def task(name: str, next_fire_time: datetime, **fields) -> ScheduledTask:
    return ScheduledTask.objects.create(
        name=name, kind="fixed_rate", trigger="every 1m", next_fire_time=next_fire_time, **fields
    )


def instance(name: str, last_seen: datetime) -> SchedulerInstance:
    return SchedulerInstance.objects.create(
        name=name,
        host="web-1",
        pid=42,
        started_at=last_seen - timedelta(hours=1),
        last_seen=last_seen,
    )


class ReportTests(TestCase):
    def report(self, now: datetime = NOW) -> dict:
        return report(
            now=now,
            overdue_after=timedelta(minutes=1),
            heartbeat_interval=timedelta(seconds=30),
            using="default",
        )

    def test_instances_alive_within_three_heartbeats(self):
        instance("fresh", NOW - timedelta(seconds=90))
        instance("stale", NOW - timedelta(seconds=91))
        body = self.report()
        self.assertEqual(
            [(i["name"], i["alive"]) for i in body["instances"]],
            [("fresh", True), ("stale", False)],
        )
        self.assertEqual(
            body["instances"][0]["last_seen"], (NOW - timedelta(seconds=90)).isoformat()
        )

    def test_a_waiting_task_without_a_live_scheduler_is_reported_but_not_failed(self):
        task("soon", NOW + timedelta(minutes=5))
        instance("stale", NOW - timedelta(minutes=10))
        body = self.report()
        self.assertTrue(body["scheduler_missing"])
        self.assertTrue(body["ok"])
        instance("fresh", NOW)
        self.assertFalse(self.report()["scheduler_missing"])

    def test_no_scheduler_is_missing_when_no_task_waits(self):
        task("paused", NOW + timedelta(minutes=5), paused=True)
        task("done", None)
        self.assertFalse(self.report()["scheduler_missing"])

    def test_beats_and_old_instances(self):
        beat(name="a", host="h", started_at=NOW, now=NOW, using="default")
        beat(name="a", host="h", started_at=NOW, now=NOW + timedelta(seconds=30), using="default")
        row = SchedulerInstance.objects.get()
        self.assertEqual(row.last_seen, NOW + timedelta(seconds=30))
        self.assertEqual(row.started_at, NOW)
        instance("gone", NOW - timedelta(days=1, seconds=1))
        self.assertEqual(forget_old_instances(now=NOW, using="default"), 1)
        self.assertEqual(list(SchedulerInstance.objects.values_list("name", flat=True)), ["a"])


class EndpointTests(TestCase):
    def test_ok_then_overdue(self):
        self.assertEqual(reverse("django_scheduling:health"), URL)
        now = datetime.now(UTC)
        task("fine", now + timedelta(minutes=5))
        response = self.client.get(URL)
        self.assertEqual(response.status_code, 200)
        self.assertTrue(response.json()["ok"])
        task("late", now - timedelta(minutes=10))
        response = self.client.get(URL)
        self.assertEqual(response.status_code, 503)
        body = response.json()
        self.assertFalse(body["ok"])
        self.assertEqual([t["name"] for t in body["overdue"]], ["late"])
        self.assertEqual(
            set(body["overdue"][0]), {"name", "trigger", "next_fire_time", "late_seconds"}
        )

    def test_the_body_is_the_one_of_scheduling_status_json(self):
        now = datetime.now(UTC)
        task("late", now - timedelta(minutes=10))
        instance("web-1:1:1", now)
        body = self.client.get(URL).json()
        out = StringIO()
        with self.assertRaises(CommandError):
            call_command("scheduling_status", "--json", stdout=out)
        printed = json.loads(out.getvalue())
        for report_ in (body, printed):
            report_.pop("checked_at")
            report_["overdue"][0].pop("late_seconds")
        self.assertEqual(body, printed)
        self.assertEqual(body["instances"][0]["name"], "web-1:1:1")

    @override_settings(SCHEDULING={"HEALTH_TOKEN": "s3cret"})
    def test_a_token_when_the_setting_asks_for_one(self):
        self.assertEqual(self.client.get(URL).status_code, 401)
        self.assertEqual(
            self.client.get(URL, headers={"authorization": "Bearer nope"}).status_code, 401
        )
        response = self.client.get(URL, headers={"authorization": "Bearer s3cret"})
        self.assertEqual(response.status_code, 200)

    def test_no_token_by_default_and_only_safe_methods(self):
        self.assertEqual(self.client.get(URL).status_code, 200)
        self.assertEqual(self.client.post(URL).status_code, 405)

    @override_settings(SCHEDULING={"UNKNOWN": 1})
    def test_bad_settings_fail_without_details(self):
        response = self.client.get(URL)
        self.assertEqual(response.status_code, 503)
        self.assertEqual(response.json(), {"ok": False})


class SettingsTests(TestCase):
    def test_the_new_keys_are_checked(self):
        with self.assertRaises(InvalidSettings) as caught:
            SchedulingSettings.from_dict({"HEARTBEAT_INTERVAL": 0, "HEALTH_TOKEN": ""})
        self.assertEqual(
            caught.exception.problems,
            [
                "SCHEDULING['HEARTBEAT_INTERVAL'] must be positive, got 0",
                "SCHEDULING['HEALTH_TOKEN'] must be a non-empty string, got '', or None",
            ],
        )


@pytest.mark.processes
class SchedulerStoppedTests(TransactionTestCase):
    """A real ``runscheduler`` checks in and keeps its task on time; once it is stopped, the
    instance goes stale and the task becomes overdue: 200, then 503."""

    @override_settings(SCHEDULING={"OVERDUE_AFTER": "1s", "HEARTBEAT_INTERVAL": "1s"})
    def test_200_then_503_once_the_scheduler_is_stopped(self):
        env = process_env(
            TESTAPP_TASKS="",
            TESTAPP_OBSERVABILITY="1",
            SCHEDULING_EXTRA=json.dumps(
                {
                    "TASK_MODULE": "observability_tasks",
                    "OVERDUE_AFTER": "1s",
                    "HEARTBEAT_INTERVAL": "1s",
                }
            ),
        )
        proc = manage("runscheduler", env=env)
        self.addCleanup(proc.kill)
        proc.wait_for("Scheduler running", timeout=30)

        def healthy() -> dict | None:
            response = self.client.get(URL)
            body = response.json()
            alive = [i for i in body.get("instances", []) if i["alive"]]
            return body if response.status_code == 200 and alive else None

        body = poll(healthy, timeout=15, message="the scheduler did not check in")
        self.assertEqual(body["instances"][0]["pid"], proc.popen.pid)
        self.assertFalse(body["scheduler_missing"])
        self.assertEqual(proc.stop(30), 0, proc.output)

        def failing() -> dict | None:
            response = self.client.get(URL)
            return response.json() if response.status_code == 503 else None

        body = poll(failing, timeout=15, message="no task became overdue")
        self.assertIn("observed_ok", [t["name"] for t in body["overdue"]])
        body = poll(
            lambda: (b := self.client.get(URL).json())["scheduler_missing"] and b,
            timeout=10,
            message="the stopped instance still counts as alive",
        )
        self.assertFalse(body["instances"][0]["alive"])
