"""``SCHEDULING["DATABASE"]`` names another alias than ``default``: the app's tables, locks and
history live there, and the rest of the project stays on ``default``.

These tests run when ``SECONDARY_DATABASE_URL`` configures the alias ``secondary`` (nox sets it:
PostgreSQL beside a SQLite ``default``, MariaDB beside a PostgreSQL ``default``).
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import TransactionTestCase, override_settings
from django.urls import reverse

from django_scheduling.checks import check_settings
from django_scheduling.locking import DatabaseLockProvider, LockConfiguration
from django_scheduling.models import RunStatus, ScheduledTask, TaskLock, TaskRun

from .processes import database_url, manage, poll, process_env
from .testapp.models import Execution

pytestmark = pytest.mark.secondary_database

ON_SECONDARY = override_settings(SCHEDULING={"DATABASE": "secondary"})


class SchedulingDatabaseAliasTests(TransactionTestCase):
    databases = {"default", "secondary"}

    def test_the_checks_accept_the_other_database(self) -> None:
        with ON_SECONDARY:
            self.assertEqual(check_settings(), [])

    def test_locks_are_taken_in_the_scheduling_database(self) -> None:
        with ON_SECONDARY:
            lock = DatabaseLockProvider().lock(LockConfiguration("report", "1m"))
            self.assertIsNotNone(lock)
            self.assertTrue(TaskLock.objects.using("secondary").filter(name="report").exists())
            self.assertFalse(TaskLock.objects.using("default").exists())
            self.assertIsNone(DatabaseLockProvider(owner="other").lock(lock.config))
            self.assertIs(lock.unlock(), True)

    def test_the_admin_reads_the_scheduling_database(self) -> None:
        ScheduledTask.objects.using("secondary").create(
            name="only-on-secondary", kind="fixed_rate", trigger="every 30s"
        )
        User.objects.create_superuser("root", "root@example.com", "pw")
        self.client.login(username="root", password="pw")
        with ON_SECONDARY:
            page = self.client.get(reverse("admin:django_scheduling_scheduledtask_changelist"))
        self.assertContains(page, "only-on-secondary")

    def test_runscheduler_keeps_its_tables_in_the_scheduling_database(self) -> None:
        vendors = (connections["default"].vendor, connections["secondary"].vendor)
        env = process_env(
            SECONDARY_DATABASE_URL=database_url("secondary"), SCHEDULING_DATABASE="secondary"
        )
        scheduler = manage("runscheduler", "--task=every_second_rate", env=env)
        self.addCleanup(scheduler.kill)
        scheduler.wait_for("Scheduler running")
        poll(
            lambda: Execution.objects.count() >= 3,
            timeout=30,
            message=f"the task did not run 3 times ({vendors})",
        )
        self.assertEqual(scheduler.stop(), 0, scheduler.output)
        runs = TaskRun.objects.using("secondary").filter(task_name="every_second_rate")
        self.assertEqual(runs.count(), Execution.objects.count())
        self.assertFalse(runs.exclude(status=RunStatus.SUCCEEDED).exists())
        self.assertTrue(
            TaskLock.objects.using("secondary").filter(name="every_second_rate").exists()
        )
        self.assertTrue(ScheduledTask.objects.using("secondary").exists())
        for model in (TaskRun, TaskLock, ScheduledTask):
            self.assertFalse(model.objects.using("default").exists(), model.__name__)
