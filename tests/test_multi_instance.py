"""Several real ``runscheduler`` processes on one database: each firing runs exactly once.

The tasks (tests/testapp/tasks.py) write a row per call with the fire time they serve, so the
checks below look at what the tasks saw, not at the scheduler's own bookkeeping. On MariaDB and
PostgreSQL two of the three instances run with their clocks skewed by libfaketime: the locks use
the server's clock.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test import TransactionTestCase

from django_scheduling.models import RunStatus, TaskLock, TaskRun

from .processes import ROOT, Process, manage, poll, process_env, skewed
from .testapp.models import Execution

# Every database on Django 6.1; Django 5.2 on MariaDB only, but for the outage: the suite's
# slowest tests, whose subject is the processes and the database, not the Django version.
pytestmark = [pytest.mark.processes, pytest.mark.sessions("6.1", "5.2/mysql")]

SECOND = timedelta(seconds=1)
EVERY_SECOND = ["every_second_cron", "every_second_rate", "every_second_delay"]


def fire_times(task: str) -> list[datetime]:
    return list(
        Execution.objects.filter(task=task)
        .order_by("fire_time")
        .values_list("fire_time", flat=True)
    )


class MultiInstanceTests(TransactionTestCase):
    def start(self, count: int, *args: str, skews: tuple[str | None, ...] = (), **env: str):
        processes = []
        for index in range(count):
            extra = dict(env, SCHEDULING_LOG_LEVEL="INFO")
            skew = skews[index] if index < len(skews) else None
            if skew:
                extra.update(skewed(skew))
            process = manage("runscheduler", *args, env=process_env(**extra))
            self.addCleanup(process.kill)
            processes.append(process)
        for process in processes:
            process.wait_for("Scheduler running")
        return processes

    def assert_exactly_once(self, task: str, times: list[datetime]) -> None:
        duplicates = [t for t, n in Counter(times).items() if n > 1]
        self.assertEqual(duplicates, [], f"{task} ran these fire times more than once")
        self.assertIsNone(Execution.objects.filter(task=task, fire_time__isnull=True).first())

    def assert_on_grid_without_gaps(self, task: str, times: list[datetime]) -> None:
        steps = [later - earlier for earlier, later in itertools.pairwise(times)]
        self.assertEqual(set(steps), {SECOND}, f"{task} missed or added fire times: {times}")

    def test_each_firing_runs_on_exactly_one_instance(self):
        skews = ("+1.5", "-1") if connection.vendor != "sqlite" else ()
        processes = self.start(
            3, *[f"--task={name}" for name in EVERY_SECOND], skews=(None, *skews)
        )
        poll(
            lambda: all(Execution.objects.filter(task=t).count() >= 20 for t in EVERY_SECOND),
            timeout=90,
            message="the tasks did not run 20 times each",
        )
        for process in processes:
            self.assertEqual(process.stop(), 0, process.output)
        for task in ("every_second_cron", "every_second_rate"):
            times = fire_times(task)
            self.assert_exactly_once(task, times)
            self.assert_on_grid_without_gaps(task, times)
        delay = list(Execution.objects.filter(task="every_second_delay").order_by("fire_time"))
        self.assert_exactly_once("every_second_delay", [e.fire_time for e in delay])
        for previous, following in itertools.pairwise(delay):
            # Each run is due one second after the previous one finished, on whichever
            # instance it ran: never sooner, and never a whole firing later (the scheduler
            # records the finish a moment after the task's own row says it ended).
            gap = following.fire_time - previous.finished
            self.assertGreaterEqual(gap, SECOND, (previous.fire_time, following.fire_time))
            self.assertLess(gap, SECOND * 2, (previous.fire_time, following.fire_time))
        # The history agrees with what the tasks saw.
        for task in EVERY_SECOND:
            runs = TaskRun.objects.filter(task_name=task)
            self.assertEqual(runs.count(), Execution.objects.filter(task=task).count())
            self.assertFalse(runs.exclude(status=RunStatus.SUCCEEDED).exists())

    def test_a_killed_lock_holder_blocks_the_task_only_until_lock_at_most_for(self):
        # "slow" runs 30 s with lock_at_most_for=3s, kept alive while its process lives.
        processes = self.start(2, "--task=slow", TESTAPP_SLOW_SECONDS="30")
        first = poll(lambda: Execution.objects.filter(task="slow").first(), timeout=30)
        holder = next(p for p in processes if p.popen.pid == first.pid)
        survivor = next(p for p in processes if p is not holder)
        # Outlive lock_at_most_for once, to see the keep-alive at work before the kill.
        poll(
            lambda: datetime.now(UTC) - first.started > timedelta(seconds=4),
            timeout=10,
            interval=0.2,
        )
        self.assertEqual(Execution.objects.filter(task="slow").count(), 1)
        holder.kill()
        killed_at = datetime.now(UTC)
        lock_until = TaskLock.objects.get(name="slow").lock_until
        second = poll(
            lambda: Execution.objects.filter(task="slow").exclude(pk=first.pk).first(),
            timeout=20,
            message="no other instance took the task over after the kill",
        )
        self.assertEqual(second.pid, survivor.popen.pid)
        self.assertGreaterEqual(second.started, lock_until - timedelta(milliseconds=50))
        self.assertLess(second.started - killed_at, timedelta(seconds=3 + 3))
        self.assertEqual(survivor.stop(), 0, survivor.output)


class DatabaseOutage:
    """Stop and restart a private database server under two running schedulers."""

    script: str  # the test server's script in scripts/, run with a private directory and port
    variables: str  # the prefix of its environment variables

    def setUp(self):
        self.dir = Path(tempfile.mkdtemp(prefix="scheduling-outage-"))
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server_env = dict(
            os.environ,
            **{f"{self.variables}_DIR": str(self.dir), f"{self.variables}_PORT": str(self.port)},
        )
        self.server("start")
        self.addCleanup(self.server, "stop")
        url = self.server("url")
        self.env = process_env(DATABASE_URL=url, SCHEDULING_LOG_LEVEL="INFO")
        migrate = Process([*manage_command(), "migrate", "-v0"], self.env)
        self.assertEqual(migrate.wait(120), 0, migrate.output)

    def server(self, action: str) -> str:
        done = subprocess.run(
            [str(ROOT / "scripts" / self.script), action],
            env=self.server_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(done.returncode, 0, f"{self.script} {action}: {done.stderr}")
        return done.stdout.strip()

    def executions(self) -> list[tuple[str, datetime, int]]:
        raise NotImplementedError

    def test_schedulers_survive_an_outage_and_resume_without_double_runs(self):
        processes = []
        for _ in range(2):
            process = Process(
                [*manage_command(), "runscheduler", "--task=every_second_rate"], self.env
            )
            self.addCleanup(process.kill)
            processes.append(process)
        for process in processes:
            process.wait_for("Scheduler running")
        poll(lambda: len(self.executions()) >= 3, timeout=30)
        self.server("stop")
        for process in processes:
            process.wait_for("the database is unavailable", timeout=30)
        for process in processes:
            self.assertIsNone(process.popen.poll(), "a scheduler died with the database")
        self.server("start")
        restarted = datetime.now(UTC)
        poll(
            lambda: sum(fire > restarted for _, fire, _ in self.executions()) >= 3,
            timeout=90,
            message="the schedulers did not resume after the database came back",
        )
        for process in processes:
            self.assertEqual(process.stop(), 0, process.output)
        times = [fire for _, fire, _ in self.executions()]
        self.assertEqual([t for t, n in Counter(times).items() if n > 1], [])


QUERY = "SELECT task, fire_time, pid FROM testapp_execution ORDER BY fire_time"


@pytest.mark.vendor("mysql")
@pytest.mark.sessions("6.1")
class MariaDBOutageTests(DatabaseOutage, TransactionTestCase):
    script, variables = "mariadb-test-server", "MARIADB_TEST"

    def executions(self) -> list[tuple[str, datetime, int]]:
        import MySQLdb

        login = {"user": "scheduling", "passwd": "scheduling", "db": "scheduling"}
        db = MySQLdb.connect(host="127.0.0.1", port=self.port, **login)
        try:
            cursor = db.cursor()
            cursor.execute(QUERY)
            return [(task, fire.replace(tzinfo=UTC), pid) for task, fire, pid in cursor.fetchall()]
        finally:
            db.close()


@pytest.mark.vendor("postgresql")
class PostgreSQLOutageTests(DatabaseOutage, TransactionTestCase):
    script, variables = "postgres-test-server", "POSTGRES_TEST"

    def executions(self) -> list[tuple[str, datetime, int]]:
        import psycopg

        with psycopg.connect(self.server("url")) as db:
            return db.execute(QUERY).fetchall()


def manage_command() -> list[str]:
    import sys

    return [sys.executable, "manage.py"]
