"""The health endpoint (``scheduling/health/``), the heartbeats of scheduler instances and the
report that ``scheduling_status --json`` shares with the endpoint."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import TestCase, TransactionTestCase, override_settings
from django.urls import reverse

from django_scheduling.conf import InvalidSettings, SchedulingSettings
from django_scheduling.models import ScheduledTask, SchedulerInstance
from django_scheduling.observability.health import DEAD_SHOWN_FOR, report
from django_scheduling.runtime.service import LIVE_MINIMUM, SchedulerService
from django_scheduling.storage.instances import beat, forget_instance, forget_old_instances

from .processes import Process, manage, poll, process_env
from .test_autostart import free_port

NOW = datetime(2026, 5, 13, 12, 0, tzinfo=UTC)
URL = "/scheduling/health/"
LIVE = "/scheduling/live/"


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

    def test_dead_instances_leave_the_report_after_a_while(self):
        instance("alive", NOW)
        instance("died lately", NOW - DEAD_SHOWN_FOR + timedelta(seconds=1))
        instance("died long ago", NOW - DEAD_SHOWN_FOR - timedelta(seconds=1))
        body = self.report()
        self.assertEqual(
            [(i["name"], i["alive"]) for i in body["instances"]],
            [("alive", True), ("died lately", False)],
        )

    def test_a_stopped_instance_is_forgotten_at_once(self):
        instance("stopping", NOW)
        task("soon", NOW + timedelta(minutes=5))
        forget_instance(name="stopping", using="default")
        body = self.report()
        self.assertEqual(body["instances"], [])
        self.assertTrue(body["scheduler_missing"])

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
    """What the endpoint tells whom: everyone whether all is well and how many tasks are
    overdue; a holder of the token, or a staff user, the names."""

    def test_ok_then_overdue(self):
        self.assertEqual(reverse("django_scheduling:health"), URL)
        now = datetime.now(UTC)
        task("fine", now + timedelta(minutes=5))
        response = self.client.get(URL)
        self.assertEqual(response.status_code, 200)
        self.assertEqual(response.json(), {"ok": True, "overdue_count": 0})
        task("late", now - timedelta(minutes=10))
        response = self.client.get(URL)
        self.assertEqual(response.status_code, 503)
        self.assertEqual(response.json(), {"ok": False, "overdue_count": 1})

    def staff(self, *, view: bool = True) -> None:
        user = User.objects.create_user("ops", password="pw", is_staff=True)
        if view:
            user.user_permissions.add(Permission.objects.get(codename="view_scheduledtask"))
        self.client.force_login(user)

    def test_a_staff_session_reads_the_names(self):
        now = datetime.now(UTC)
        task("late", now - timedelta(minutes=10))
        instance("web-1:1:1", now)
        self.staff()
        body = self.client.get(URL).json()
        self.assertEqual([t["name"] for t in body["overdue"]], ["late"])
        self.assertEqual(
            set(body["overdue"][0]),
            {"name", "trigger", "reason", "next_fire_time", "late_seconds"},
        )
        self.assertEqual(body["overdue"][0]["reason"], "not started")
        self.assertEqual(body["instances"][0]["pid"], 42)

    def test_staff_without_the_view_permission_read_the_counts_only(self):
        task("late", datetime.now(UTC) - timedelta(minutes=10))
        self.staff(view=False)
        self.assertEqual(self.client.get(URL).json(), {"ok": False, "overdue_count": 1})

    def test_the_full_body_is_the_one_of_scheduling_status_json(self):
        now = datetime.now(UTC)
        task("late", now - timedelta(minutes=10))
        instance("web-1:1:1", now)
        self.staff()
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
    def test_the_token_reads_the_names_and_a_wrong_one_is_refused(self):
        task("late", datetime.now(UTC) - timedelta(minutes=10))
        self.assertEqual(self.client.get(URL).json(), {"ok": False, "overdue_count": 1})
        for wrong in ("Bearer nope", "Basic czNjcmV0"):
            with self.subTest(header=wrong):
                response = self.client.get(URL, headers={"authorization": wrong})
                self.assertEqual(response.status_code, 401)
                self.assertEqual(response["WWW-Authenticate"], "Bearer")
        response = self.client.get(URL, headers={"authorization": "Bearer s3cret"})
        self.assertEqual(response.status_code, 503)
        self.assertEqual([t["name"] for t in response.json()["overdue"]], ["late"])

    def test_a_token_when_none_is_configured_is_refused(self):
        response = self.client.get(URL, headers={"authorization": "Bearer anything"})
        self.assertEqual(response.status_code, 401)

    def test_only_safe_methods(self):
        self.assertEqual(self.client.get(URL).status_code, 200)
        self.assertEqual(self.client.post(URL).status_code, 405)

    @override_settings(SCHEDULING={"UNKNOWN": 1, "HEALTH_TOKEN": "s3cret"})
    def test_a_configuration_error_is_counted_and_named_to_the_token(self):
        response = self.client.get(URL)
        self.assertEqual(response.status_code, 503)
        self.assertEqual(response.json(), {"ok": False, "configuration_errors": 1})
        response = self.client.get(URL, headers={"authorization": "Bearer s3cret"})
        body = response.json()
        self.assertEqual(body["configuration_errors"], 1)
        self.assertEqual(body["problems"][0]["id"], "django_scheduling.E004")
        self.assertIn("unknown key 'UNKNOWN'", body["problems"][0]["message"])


class MissingTablesTests(TransactionTestCase):
    def test_missing_tables_say_to_run_migrate(self):
        table = ScheduledTask._meta.db_table
        hidden = connection.ops.quote_name(f"{table}_hidden")
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {connection.ops.quote_name(table)} RENAME TO {hidden}")
        self.addCleanup(self.restore, table, hidden)
        response = self.client.get(URL)
        self.assertEqual(response.status_code, 503)
        self.assertEqual(
            response.json(),
            {
                "ok": False,
                "error": "the database has no django_scheduling tables; run "
                "`python manage.py migrate`",
            },
        )

    def restore(self, table: str, hidden: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {hidden} RENAME TO {connection.ops.quote_name(table)}")


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


def http_get(url: str) -> tuple[int, dict] | None:
    """Return the status and JSON body of GET *url*, or ``None`` while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError:
        return None


TOKEN = {"authorization": "Bearer t0ken"}


@pytest.mark.processes
@override_settings(
    SCHEDULING={"OVERDUE_AFTER": "1s", "HEARTBEAT_INTERVAL": "1s", "HEALTH_TOKEN": "t0ken"}
)
class ProbeProcessTests(TransactionTestCase):
    """A real ``runscheduler`` with its liveness probe (``--health-port``), through a clean stop
    and a kill -9, and the health report of every instance."""

    def start(self) -> tuple[Process, str]:
        port = free_port()
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
        proc = manage("runscheduler", "--health-port", str(port), env=env)
        self.addCleanup(proc.kill)
        proc.wait_for("Scheduler running", timeout=30)
        live = f"http://127.0.0.1:{port}/live"
        answer = poll(lambda: http_get(live), timeout=15, message="the probe did not answer")
        self.assertEqual(answer, (200, {"alive": True, "scheduler": "running"}))
        self.assertEqual(http_get(f"http://127.0.0.1:{port}/other")[0], 404)
        return proc, live

    def full(self) -> tuple[int, dict]:
        response = self.client.get(URL, headers=TOKEN)
        return response.status_code, response.json()

    def checked_in(self, proc: Process) -> dict:
        def alive() -> dict | None:
            status, body = self.full()
            mine = [i for i in body.get("instances", []) if i["pid"] == proc.popen.pid]
            return body if status == 200 and mine and mine[0]["alive"] else None

        return poll(alive, timeout=15, message="the scheduler did not check in")

    def test_a_clean_stop_leaves_the_report_at_once_and_the_probe_goes(self):
        proc, live = self.start()
        body = self.checked_in(proc)
        self.assertFalse(body["scheduler_missing"])
        self.assertEqual(proc.stop(30), 0, proc.output)
        # Deregistered on the way out: no waiting for its heartbeat to go stale.
        _, body = self.full()
        self.assertEqual(body["instances"], [])
        self.assertTrue(body["scheduler_missing"])
        self.assertIsNone(http_get(live))
        body = poll(
            lambda: (answer := self.full())[0] == 503 and answer[1],
            timeout=15,
            message="no task became overdue",
        )
        self.assertIn("observed_ok", [t["name"] for t in body["overdue"]])

    def test_a_killed_scheduler_is_listed_dead_and_its_probe_fails(self):
        proc, live = self.start()
        self.checked_in(proc)
        proc.kill()  # SIGKILL: no chance to deregister
        self.assertIsNone(http_get(live))

        def dead() -> dict | None:
            _, body = self.full()
            mine = [i for i in body["instances"] if i["pid"] == proc.popen.pid]
            return body if mine and not mine[0]["alive"] else None

        body = poll(dead, timeout=15, message="the killed instance still counts as alive")
        self.assertTrue(body["scheduler_missing"])


class LivenessTests(TransactionTestCase):
    """``scheduling/live/``: this process's scheduler, read from its threads (no query)."""

    def test_none_running_here_is_alive(self):
        from django_scheduling.runtime import service as service_module

        self.addCleanup(setattr, service_module, "_current", service_module._current)
        service_module._current = None
        response = self.client.get(LIVE)
        self.assertEqual(reverse("django_scheduling:live"), LIVE)
        self.assertEqual(response.status_code, 200)
        self.assertEqual(response.json(), {"alive": True, "scheduler": "none in this process"})

    def test_running_then_a_dead_thread_then_stopped(self):
        service = SchedulerService([])
        service.start()
        self.addCleanup(service.stop, 5)
        response = self.client.get(LIVE)
        self.assertEqual(
            (response.status_code, response.json()), (200, {"alive": True, "scheduler": "running"})
        )

        assert service.maintenance is not None
        service.maintenance.stop(timeout=5)  # its thread ends, as if it had died
        response = self.client.get(LIVE)
        self.assertEqual(response.status_code, 503)
        self.assertEqual(
            response.json(),
            {
                "alive": False,
                "scheduler": "failed",
                "problems": ["the maintenance thread has stopped"],
            },
        )
        service.stop(5)
        response = self.client.get(LIVE)
        self.assertEqual(
            (response.status_code, response.json()), (503, {"alive": False, "scheduler": "stopped"})
        )

    def test_a_maintenance_pass_that_does_not_end_is_not_alive(self):
        service = SchedulerService([])
        service.start()
        self.addCleanup(service.stop, 5)
        assert service.maintenance is not None
        # Read once: the thread may end another pass meanwhile, which only makes the next
        # reading later.
        last = service.maintenance.last_pass
        self.assertGreaterEqual(service.stalled_after, LIVE_MINIMUM)
        liveness = service.liveness(last + service.stalled_after + 30)
        self.assertFalse(liveness.alive)
        self.assertEqual(len(liveness.problems), 1)
        self.assertIn("has not ended a pass for", liveness.problems[0])
        self.assertTrue(service.liveness(last + service.stalled_after - 1).alive)
