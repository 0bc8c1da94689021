"""Failure alerts: ``task_failing`` after N failures in a row and on recovery, counted from the
run history (so across restarts), and the mail to ``ADMINS``. A live scheduler service runs the
tasks in this process."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import django
from django.core import mail
from django.test import TransactionTestCase, override_settings

from django_scheduling.models import RunStatus, TaskRun
from django_scheduling.observability import alerts
from django_scheduling.runtime.service import SchedulerService
from django_scheduling.signals import task_failing
from django_scheduling.tasks.registry import TaskRegistry

from .processes import poll

# Django 6 takes addresses; (name, address) pairs are deprecated there and needed before.
ADMINS = ["ops@example.com"] if django.VERSION >= (6, 0) else [("Ops", "ops@example.com")]


class Flaky:
    """Fails its first *failures* calls, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.calls += 1
            if self.calls <= self.failures:
                raise RuntimeError(f"failure {self.calls}")


class AlertTests(TransactionTestCase):
    def setUp(self) -> None:
        # Other test modules clear the signals' receivers; connect this module's again.
        alerts.install()
        self.sent: list[dict] = []
        task_failing.connect(self.receive)
        self.addCleanup(task_failing.disconnect, self.receive)

    def receive(self, sender: str, **kwargs) -> None:
        self.sent.append({"sender": sender, **kwargs})

    def run_until(self, func, name: str, succeeded: int = 1) -> None:
        definitions = TaskRegistry()
        service = SchedulerService([definitions.add(func, fixed_rate="200ms", name=name)])
        service.start()
        self.addCleanup(service.stop, 5)
        poll(
            lambda: (
                TaskRun.objects.filter(task_name=name, status=RunStatus.SUCCEEDED).count()
                >= succeeded
            ),
            timeout=20,
        )
        service.stop(5)

    def summary(self) -> list[tuple]:
        return [(s["sender"], s["failures"], s["recovered"]) for s in self.sent]

    @override_settings(
        SCHEDULING={"ALERT_AFTER_FAILURES": 2, "ALERT_MAIL_ADMINS": True},
        ADMINS=ADMINS,
    )
    def test_sent_once_at_the_threshold_and_once_on_recovery_with_mails(self):
        self.run_until(Flaky(3), "flaky")
        self.assertEqual(self.summary(), [("flaky", 2, False), ("flaky", 3, True)])
        failing, recovered = self.sent
        runs = list(TaskRun.objects.filter(task_name="flaky").order_by("started_at", "id"))
        self.assertEqual(failing["run"], runs[1].pk)
        self.assertIsInstance(failing["exception"], RuntimeError)
        self.assertEqual(recovered["run"], runs[3].pk)
        self.assertIsNone(recovered["exception"])
        self.assertEqual(failing["task"].name, "flaky")
        poll(lambda: len(mail.outbox) == 2, timeout=10, message=str(mail.outbox))
        subjects = sorted(message.subject for message in mail.outbox)
        self.assertEqual(
            subjects,
            [
                "[Django] Scheduled task flaky has failed 2 times in a row",
                "[Django] Scheduled task flaky has recovered after 3 failures in a row",
            ],
        )
        self.assertEqual(mail.outbox[0].to, ["ops@example.com"])

    @override_settings(SCHEDULING={"ALERT_AFTER_FAILURES": 2})
    def test_failures_before_a_restart_count(self):
        # A run that failed before this process started, on another instance.
        now = datetime.now(UTC)
        TaskRun.objects.create(
            task_name="restarted",
            started_at=now - timedelta(minutes=1),
            finished_at=now - timedelta(minutes=1),
            status=RunStatus.FAILED,
            instance="other:1:1",
        )
        self.run_until(Flaky(1), "restarted")
        self.assertEqual(self.summary(), [("restarted", 2, False), ("restarted", 2, True)])
        self.assertEqual(mail.outbox, [])  # ALERT_MAIL_ADMINS is off

    @override_settings(SCHEDULING={"ALERT_AFTER_FAILURES": 2, "HISTORY": False})
    def test_without_history_each_process_counts_in_memory(self):
        ran = Flaky(2)
        definitions = TaskRegistry()
        service = SchedulerService([definitions.add(ran, fixed_rate="200ms", name="unrecorded")])
        service.start()
        self.addCleanup(service.stop, 5)
        poll(lambda: len(self.sent) == 2, timeout=20, message=str(self.sent))
        service.stop(5)
        self.assertEqual(self.summary(), [("unrecorded", 2, False), ("unrecorded", 2, True)])

    def test_off_by_default(self):
        self.run_until(Flaky(3), "unwatched")
        self.assertEqual(self.sent, [])


class StreakTests(TransactionTestCase):
    """The streak an alert reports is counted at the run it is about, however late its event
    is delivered: by then later runs of the task may be recorded (every 200 ms, say)."""

    def record(self, *statuses: RunStatus) -> list[int]:
        start = datetime.now(UTC) - timedelta(minutes=10)
        return [
            TaskRun.objects.create(
                task_name="streak",
                started_at=start + timedelta(seconds=index),
                finished_at=start + timedelta(seconds=index),
                status=status,
                instance="a:1:1",
            ).pk
            for index, status in enumerate(statuses)
        ]

    def test_a_recovery_counts_the_failures_before_it_not_the_runs_after_it(self):
        failed, succeeded = RunStatus.FAILED, RunStatus.SUCCEEDED
        ids = self.record(succeeded, failed, failed, succeeded, succeeded)
        count = alerts.failures_in_a_row("streak", before=ids[3], limit=5, using="default")
        self.assertEqual(count, 2)

    def test_a_failure_counts_the_streak_it_ends_not_the_runs_after_it(self):
        failed, succeeded = RunStatus.FAILED, RunStatus.SUCCEEDED
        ids = self.record(succeeded, failed, failed, succeeded)
        count = alerts.failures_in_a_row("streak", through=ids[2], limit=5, using="default")
        self.assertEqual(count, 2)
