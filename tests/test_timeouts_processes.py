"""Hung runs, timeouts and retries in real ``runscheduler`` processes.

The tasks are in tests/testapp/observability_tasks.py. Whether a task is overdue is read from
the health report at explicit times, against the rows the real scheduler wrote: just before
and just after its missed fire time plus ``OVERDUE_AFTER`` (or its timeout).
"""

from __future__ import annotations

import json
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import TransactionTestCase, override_settings

from django_scheduling.clock import utcnow
from django_scheduling.models import RunStatus, ScheduledTask, TaskRun
from django_scheduling.observability.health import report

from .processes import Process, manage, poll, process_env
from .testapp.models import Execution

pytestmark = pytest.mark.processes

OVERDUE_AFTER = timedelta(seconds=1)
EPSILON = timedelta(milliseconds=100)
SECOND = timedelta(seconds=1)


class ObservedTests(TransactionTestCase):
    def setUp(self) -> None:
        directory = tempfile.TemporaryDirectory(prefix="scheduling-release-")
        self.addCleanup(directory.cleanup)
        self.release = Path(directory.name) / "release"

    def start(self, tasks: str, count: int = 1) -> list[Process]:
        env = process_env(
            TESTAPP_TASKS="",
            TESTAPP_OBSERVABILITY=tasks,
            TESTAPP_RELEASE_FILE=str(self.release),
            SCHEDULING_LOG_LEVEL="INFO",
            SCHEDULING_EXTRA=json.dumps(
                {
                    "TASK_MODULE": "observability_tasks",
                    "OVERDUE_AFTER": "1s",
                    "HEARTBEAT_INTERVAL": "1s",
                    "SHUTDOWN_TIMEOUT": "5s",
                }
            ),
        )
        processes = [manage("runscheduler", env=env) for _ in range(count)]
        for process in processes:
            self.addCleanup(process.kill)
        for process in processes:
            process.wait_for("Scheduler running", timeout=60)
        return processes

    def overdue(self, name: str, at) -> dict | None:
        body = report(
            now=at, overdue_after=OVERDUE_AFTER, heartbeat_interval=SECOND, using="default"
        )
        return next((task for task in body["overdue"] if task["name"] == name), None)

    def hung_run(self, name: str) -> TaskRun:
        """Wait until *name*'s first run has started and its claim stored the next fire time."""
        poll(lambda: Execution.objects.filter(task=name).exists(), timeout=30)
        run = TaskRun.objects.get(task_name=name)
        row = ScheduledTask.objects.get(name=name)
        self.assertEqual((row.last_run_id, row.last_fire_time), (run.pk, run.scheduled_at))
        self.assertEqual(row.next_fire_time, run.scheduled_at + 2 * SECOND)
        return run

    def test_a_hung_run_is_overdue_once_its_next_fire_time_is_overdue_after_late(self):
        (scheduler,) = self.start("hang")
        run = self.hung_run("hangs")
        missed = run.scheduled_at + 2 * SECOND  # its next fire time, which it holds up
        self.assertIsNone(self.overdue("hangs", missed + OVERDUE_AFTER - EPSILON))
        late = self.overdue("hangs", missed + OVERDUE_AFTER + EPSILON)
        self.assertIsNotNone(late)
        self.assertEqual(late["reason"], "hung")
        # And so it is, in real time, while the run still hangs.
        poll(lambda: self.overdue("hangs", utcnow()), timeout=30)
        self.assertEqual(TaskRun.objects.get(pk=run.pk).status, RunStatus.RUNNING)

        self.release.touch()
        finished = poll(
            lambda: TaskRun.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).first(),
            timeout=30,
        )
        self.assertIsNone(finished.timeout_at)
        # The schedule goes on: the next run comes once the hung one has ended.
        poll(lambda: TaskRun.objects.filter(task_name="hangs").count() >= 2, timeout=30)
        self.assertEqual(scheduler.stop(), 0, scheduler.output)

    def test_a_run_past_its_timeout_is_overdue_as_timed_out_and_recorded_so(self):
        (scheduler,) = self.start("hang_timeout")
        run = self.hung_run("hangs_timeout")
        self.assertEqual(run.timeout_at, run.started_at + SECOND)
        # Before its next fire time: only the timeout makes it overdue.
        self.assertIsNone(self.overdue("hangs_timeout", run.timeout_at - EPSILON))
        late = self.overdue("hangs_timeout", run.timeout_at + EPSILON)
        self.assertEqual(late["reason"], "timed out")
        scheduler.wait_for("has passed its timeout of 1s", timeout=30)

        self.release.touch()
        ended = poll(
            lambda: TaskRun.objects.filter(pk=run.pk, status=RunStatus.TIMED_OUT).first(),
            timeout=30,
        )
        self.assertEqual(ended.error_type, "django_scheduling.context.RunTimedOut")
        self.assertIn("past its timeout of 1s; then succeeded", ended.error_message)
        self.assertEqual(scheduler.stop(), 0, scheduler.output)

    @override_settings(SCHEDULING={"HEALTH_TOKEN": "t0ken", "OVERDUE_AFTER": "1s"})
    def test_the_health_endpoint_names_the_hung_task_to_the_token(self):
        self.start("hang")
        self.hung_run("hangs")

        def listed() -> dict | None:
            response = self.client.get(
                "/scheduling/health/", headers={"authorization": "Bearer t0ken"}
            )
            return response.json() if response.status_code == 503 else None

        body = poll(listed, timeout=30, message="the hung task was not reported overdue")
        self.assertEqual([(t["name"], t["reason"]) for t in body["overdue"]], [("hangs", "hung")])
        anonymous = self.client.get("/scheduling/health/")
        self.assertEqual(anonymous.status_code, 503)
        self.assertEqual(anonymous.json(), {"ok": False, "overdue_count": 1})
        self.release.touch()

    def test_retries_serve_one_fire_time_in_three_attempts_on_one_instance(self):
        schedulers = self.start("flaky", count=2)
        poll(
            lambda: TaskRun.objects.filter(task_name="flaky", status=RunStatus.SUCCEEDED).exists(),
            timeout=30,
            message="the third attempt did not succeed",
        )
        runs = list(TaskRun.objects.filter(task_name="flaky").order_by("attempt"))
        self.assertEqual(
            [(r.attempt, r.status, r.error_message) for r in runs],
            [
                (1, RunStatus.FAILED, "attempt 1 fails"),
                (2, RunStatus.FAILED, "attempt 2 fails"),
                (3, RunStatus.SUCCEEDED, ""),
            ],
        )
        self.assertEqual(len({r.scheduled_at for r in runs}), 1)
        # Under one lock, on one instance: the other never ran that fire time.
        executions = Execution.objects.filter(task="flaky")
        self.assertEqual(executions.count(), 3)
        self.assertEqual(len({e.pid for e in executions}), 1)
        self.assertEqual(len({r.instance for r in runs}), 1)
        for scheduler in schedulers:
            self.assertEqual(scheduler.stop(), 0, scheduler.output)
