"""Redeploys and database outages, with real ``runscheduler`` processes.

A redeploy is a process stopped and another started with a different trigger for the same task
(the tasks in tests/testapp/redeploy_tasks.py read their triggers from the environment), or,
blue/green, both running at once. The outages stop a private MariaDB server, or, on SQLite,
move the directory holding the database file away, under running schedulers. The checks look
at the rows the tasks wrote (``Execution``, with the fire time each call served) and at the
scheduler's own rows.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test import SimpleTestCase, TransactionTestCase
from django.utils import timezone

from django_scheduling.models import RunStatus, ScheduledTask, TaskRun
from django_scheduling.schedules.triggers import make_trigger

from .processes import ROOT, Process, manage, poll, process_env
from .testapp.models import Execution

# Every database on Django 6.1 only: among the suite's slowest tests, whose subject is the
# processes and the database, not the Django version (test_multi_instance.py keeps Django 5.2).
pytestmark = [pytest.mark.processes, pytest.mark.sessions("6.1")]

FAKETIME = next(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"), None)
#: The first deployment of the zone-change check runs this far in the past: zones differ by
#: 15 minutes at least, so a daily cron moves by that much when its zone changes.
LAG = timedelta(seconds=910)
KATHMANDU, KOLKATA = "Asia/Kathmandu", "Asia/Kolkata"  # UTC+05:45 and UTC+05:30


def slow_clock(lag: timedelta) -> dict[str, str]:
    """Environment that sets a process's wall clock *lag* behind (libfaketime)."""
    if FAKETIME is None:
        raise AssertionError("libfaketime is missing: apt-get install faketime")
    return {
        "LD_PRELOAD": str(FAKETIME),
        "FAKETIME": f"-{int(lag.total_seconds())}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def launch(*tasks: str, env: dict[str, str] | None = None, **extra: str) -> Process:
    """Start ``runscheduler`` for *tasks* (without waiting for it)."""
    extra = {"TESTAPP_REDEPLOY": "1", "SCHEDULING_LOG_LEVEL": "INFO", **extra}
    args = [f"--task={task}" for task in tasks]
    if env is not None:
        return Process([sys.executable, "manage.py", "runscheduler", *args], {**env, **extra})
    return manage("runscheduler", *args, env=process_env(**extra))


def stays(predicate: Callable[[], bool], seconds: float, message: str) -> None:
    """Fail unless *predicate* holds throughout the next *seconds*."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            raise AssertionError(message)
        time.sleep(0.1)


def cron_at(moment: datetime, *, daily: bool = False) -> str:
    """Return a cron expression matching *moment*'s wall time hourly (or daily)."""
    return f"{moment.second} {moment.minute} {moment.hour if daily else '*'} * * *"


class RedeployTests(TransactionTestCase):
    """A task's trigger changes between deployments, or differs between two at once."""

    maxDiff = None

    def scheduler(self, *tasks: str, **env: str) -> Process:
        process = launch(*tasks, **env)
        self.addCleanup(process.kill)
        process.wait_for("Scheduler running")
        return process

    def stop(self, *processes: Process) -> None:
        for process in processes:
            self.assertEqual(process.stop(), 0, process.output)

    def test_a_changed_trigger_runs_no_fire_time_from_before_the_change(self):
        tasks = ("redeploy_cron", "redeploy_run_all", "redeploy_zoned")
        # The old deployment: every second, and a daily time in Kathmandu a few seconds ahead.
        # It runs 910 s in the past (its clock is slow), as if the new deployment came a
        # quarter of an hour after it stopped.
        daily = (datetime.now(UTC) - LAG + timedelta(seconds=8)).astimezone(ZoneInfo(KATHMANDU))
        old = self.scheduler(
            *tasks,
            TESTAPP_CRON="* * * * * *",
            TESTAPP_RUN_ALL_CRON="* * * * * *",
            TESTAPP_ZONED_CRON=cron_at(daily, daily=True),
            TESTAPP_CRON_ZONE=KATHMANDU,
            **slow_clock(LAG),
        )
        poll(
            lambda: all(Execution.objects.filter(task=task).exists() for task in tasks),
            timeout=30,
            message="the old deployment did not run each task",
        )
        self.stop(old)
        self.assertEqual(
            Execution.objects.get(task="redeploy_zoned").fire_time, daily.replace(microsecond=0)
        )
        # The new deployment: an hourly time that passed 7 s ago; every other second with
        # missed="run_all"; the same daily time in Kolkata, which came 15 minutes after the
        # old run, some seconds before this deployment.
        deployed = datetime.now(UTC)
        new = self.scheduler(
            *tasks,
            TESTAPP_CRON=cron_at(deployed - timedelta(seconds=7)),
            TESTAPP_RUN_ALL_CRON="*/2 * * * * *",
            TESTAPP_ZONED_CRON=cron_at(daily, daily=True),
            TESTAPP_CRON_ZONE=KOLKATA,
        )
        # Two runs on the new every-other-second grid show the new deployment fires; the
        # stale fire times would have run first, at start.
        poll(
            lambda: (
                Execution.objects.filter(
                    task="redeploy_run_all", pid=new.popen.pid, fire_time__gt=deployed
                ).count()
                >= 2
            ),
            timeout=60,
            message="the new deployment did not run redeploy_run_all on its new trigger",
        )
        self.stop(new)
        stale = {
            task: times
            for task in tasks
            if (
                times := list(
                    Execution.objects.filter(
                        task=task, pid=new.popen.pid, fire_time__lte=deployed
                    ).values_list("fire_time", flat=True)[:5]
                )
            )
        }
        self.assertEqual(stale, {}, "fire times from before the change ran")
        # The hourly and the daily task have no fire time between the deploy and now.
        self.assertFalse(Execution.objects.filter(task__in=tasks[::2], pid=new.popen.pid).exists())
        self.assertFalse(
            TaskRun.objects.filter(started_at__gte=deployed, scheduled_at__lte=deployed).exists()
        )
        runs = Execution.objects.filter(task="redeploy_run_all", pid=new.popen.pid)
        self.assertEqual({e.fire_time.second % 2 for e in runs}, {0}, "not the new trigger")

    def test_a_one_shot_whose_time_moves_fires_at_the_new_time(self):
        old_at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
        old = self.scheduler("redeploy_once", TESTAPP_AT=old_at.isoformat())
        first = poll(
            lambda: Execution.objects.filter(task="redeploy_once").first(),
            timeout=20,
            message="the one-shot did not fire at its first time",
        )
        self.assertEqual(first.fire_time, old_at)
        self.stop(old)
        new_at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4)
        new = self.scheduler("redeploy_once", TESTAPP_AT=new_at.isoformat())
        second = poll(
            lambda: Execution.objects.filter(task="redeploy_once", pid=new.popen.pid).first(),
            timeout=20,
            message="the one-shot did not fire at its new time",
        )
        self.assertEqual(second.fire_time, new_at)
        self.assertGreaterEqual(second.started, new_at)
        self.stop(new)
        self.assertEqual(Execution.objects.filter(task="redeploy_once").count(), 2)
        runs = TaskRun.objects.filter(task_name="redeploy_once").order_by("started_at")
        self.assertEqual([run.scheduled_at for run in runs], [old_at, new_at])

    def test_blue_green_the_newest_deployments_trigger_applies(self):
        """Two deployments at once, each with its own trigger for the same task: the one
        started last syncs the row, so its trigger applies; the older one skips every firing
        with a WARNING, and none of its fire times runs any more."""
        blue = self.scheduler("redeploy_colour", TESTAPP_COLOUR_CRON="* * * * * *")
        poll(lambda: Execution.objects.filter(task="redeploy_colour").count() >= 2, timeout=30)
        green = self.scheduler("redeploy_colour", TESTAPP_COLOUR_CRON="*/3 * * * * *")
        green_started = datetime.now(UTC)  # green has synced the row before it said "running"
        poll(
            lambda: (
                Execution.objects.filter(
                    task="redeploy_colour", fire_time__gt=green_started
                ).count()
                >= 3
            ),
            timeout=30,
            message="the task stopped running after the second deployment started",
        )
        self.assertIsNone(blue.popen.poll(), "the older deployment died")
        self.stop(blue, green)
        executions = list(Execution.objects.filter(task="redeploy_colour").order_by("fire_time"))
        times = [e.fire_time for e in executions]
        self.assertEqual([t for t, n in Counter(times).items() if n > 1], [], "ran twice")
        later = [e for e in executions if e.fire_time > green_started]
        self.assertEqual(
            [e.fire_time for e in later if e.fire_time.second % 3],
            [],
            "fire times of the older deployment's trigger ran after the newer one started",
        )
        self.assertEqual({e.pid for e in later}, {green.popen.pid})
        self.assertIn("another deployment declared a different trigger", blue.output)
        described = make_trigger(cron="*/3 * * * * *", default_zone=UTC).describe()
        self.assertEqual(ScheduledTask.objects.get(name="redeploy_colour").trigger, described)

    def test_blue_green_the_older_deployment_leaves_the_lock_to_the_newer_one(self):
        """With lock_at_least_for, every lock taken holds the task that long. The older
        deployment, which skips each of its firings now, must not take the lock to do so:
        the newer deployment's fire times would come late, or be missed."""
        least = {"SCHEDULING_EXTRA": '{"LOCK_AT_LEAST_FOR": "2s"}'}
        blue = self.scheduler("redeploy_colour", TESTAPP_COLOUR_CRON="* * * * * *", **least)
        poll(lambda: Execution.objects.filter(task="redeploy_colour").exists(), timeout=30)
        green = self.scheduler("redeploy_colour", TESTAPP_COLOUR_CRON="*/3 * * * * *", **least)
        green_started = datetime.now(UTC)
        poll(
            lambda: Execution.objects.filter(
                task="redeploy_colour", fire_time__gte=green_started + timedelta(seconds=13)
            ).exists(),
            timeout=40,
            message="the newer deployment did not run the task",
        )
        self.stop(blue, green)
        times = list(
            Execution.objects.filter(task="redeploy_colour", fire_time__gt=green_started)
            .order_by("fire_time")
            .values_list("fire_time", flat=True)
        )
        steps = {later - earlier for earlier, later in itertools.pairwise(times)}
        self.assertEqual(steps, {timedelta(seconds=3)}, f"fire times missed: {times}")

    def test_a_run_under_way_when_a_newer_deployment_changes_the_trigger_keeps_its_lock(self):
        """The newer deployment resets the task's row while the older one runs it: the run
        ends normally. Its lock was never lost, and nothing may say so."""
        release = Path(tempfile.mkdtemp()) / "release"
        self.addCleanup(shutil.rmtree, release.parent)
        blue = self.scheduler("redeploy_delay", TESTAPP_DELAY="1s", TESTAPP_RELEASE=str(release))
        running = poll(
            lambda: Execution.objects.filter(task="redeploy_delay").first(),
            timeout=20,
            message="redeploy_delay did not start",
        )
        # The run goes on until the newer deployment is up and has reset the task's row.
        green = self.scheduler("redeploy_delay", TESTAPP_DELAY="2s", TESTAPP_RELEASE=str(release))
        self.assertIsNone(Execution.objects.get(pk=running.pk).finished)
        release.touch()
        poll(
            lambda: Execution.objects.filter(task="redeploy_delay", pid=green.popen.pid).exists(),
            timeout=20,
            message="the newer deployment did not run the task",
        )
        self.stop(blue, green)
        self.assertNotIn("lost its lock", blue.output)
        run = TaskRun.objects.get(task_name="redeploy_delay", scheduled_at=running.fire_time)
        self.assertEqual(run.status, RunStatus.SUCCEEDED)
        self.assertFalse(run.lock_lost)
        self.assertFalse(
            TaskRun.objects.filter(task_name="redeploy_delay", lock_lost=True).exists()
        )

    def test_a_run_now_request_waits_for_the_lock_and_runs_once(self):
        processes = [launch("long_hourly", TESTAPP_LONG_SECONDS="6") for _ in range(2)]
        for process in processes:
            self.addCleanup(process.kill)
        # The first instance up runs the task's scheduled firing for 6 s under its lock.
        held = poll(
            lambda: Execution.objects.filter(task="long_hourly").first(),
            timeout=30,
            message="long_hourly did not start",
        )
        # Run now, as the admin asks for it, while that instance holds the lock.
        requested = timezone.now()
        asked = ScheduledTask.objects.filter(
            name="long_hourly", run_requested_at__isnull=True
        ).update(run_requested_at=requested)
        self.assertEqual(asked, 1)
        for process in processes:
            process.wait_for("Scheduler running")
        self.assertIsNone(
            Execution.objects.get(pk=held.pk).finished,
            "the scheduled run ended before both instances were up; the test needs it longer",
        )

        def holder_finished() -> datetime | None:
            # The request must stay in the row while the lock is held: read the row first.
            pending = ScheduledTask.objects.filter(
                name="long_hourly", run_requested_at=requested
            ).exists()
            finished = Execution.objects.get(pk=held.pk).finished
            if not pending and finished is None:
                raise AssertionError("the request was taken while the lock was held elsewhere")
            return finished

        finished = poll(holder_finished, timeout=30)
        manual = poll(
            lambda: Execution.objects.filter(
                task="long_hourly", fire_time__isnull=True, finished__isnull=False
            ).first(),
            timeout=20,
            message="the requested run did not happen after the lock was free",
        )
        self.assertGreaterEqual(manual.started, finished)
        stays(
            lambda: (
                Execution.objects.filter(task="long_hourly", fire_time__isnull=True).count() == 1
            ),
            2.5,  # two passes of each instance's maintenance thread
            "the requested run ran more than once",
        )
        self.stop(*processes)
        self.assertIsNone(ScheduledTask.objects.get(name="long_hourly").run_requested_at)
        scheduled = TaskRun.objects.get(task_name="long_hourly", scheduled_at__isnull=False)
        runs = list(TaskRun.objects.filter(task_name="long_hourly", scheduled_at__isnull=True))
        self.assertEqual(len(runs), 1)
        self.assertEqual(runs[0].status, RunStatus.SUCCEEDED)
        self.assertGreaterEqual(runs[0].started_at, scheduled.finished_at)


class _MariaDB:
    """A private MariaDB server that a test stops and starts."""

    def __init__(self, directory: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.env = dict(
            os.environ, MARIADB_TEST_DIR=str(directory), MARIADB_TEST_PORT=str(self.port)
        )
        self.url = f"mysql://scheduling:scheduling@127.0.0.1:{self.port}/scheduling"

    def _server(self, action: str) -> None:
        subprocess.run(
            [str(ROOT / "scripts" / "mariadb-test-server"), action],
            env=self.env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def make_available(self) -> None:
        self._server("start")

    def make_unavailable(self) -> None:
        self._server("stop")

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        import MySQLdb

        db = MySQLdb.connect(
            host="127.0.0.1",
            port=self.port,
            user="scheduling",
            passwd="scheduling",
            db="scheduling",
        )
        try:
            cursor = db.cursor()
            cursor.execute(sql)
            return list(cursor.fetchall())
        finally:
            db.close()


class _SQLiteFile:
    """A private SQLite database whose directory is moved away and back, as when the volume
    holding it goes away: opening the file fails while it is gone."""

    def __init__(self, directory: Path) -> None:
        self.home = directory / "db"
        self.away = directory / "db-away"
        self.home.mkdir()
        self.path = self.home / "db.sqlite3"
        self.url = f"sqlite:///{self.path}"

    def make_available(self) -> None:
        if self.away.exists():
            self.away.rename(self.home)

    def make_unavailable(self) -> None:
        self.home.rename(self.away)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        db = sqlite3.connect(self.path)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()


class OutageTests(SimpleTestCase):
    """Schedulers on a private database (MariaDB server, or SQLite file) that goes away."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.directory = Path(tempfile.mkdtemp(prefix="scheduling-outage-"))
        cls.addClassCleanup(shutil.rmtree, cls.directory, ignore_errors=True)
        cls.database = (
            _MariaDB(cls.directory) if connection.vendor == "mysql" else _SQLiteFile(cls.directory)
        )
        cls.database.make_available()
        cls.addClassCleanup(cls.database.make_unavailable)
        cls.env = process_env(DATABASE_URL=cls.database.url)
        migrate = Process([sys.executable, "manage.py", "migrate", "-v0"], cls.env)
        if migrate.wait(120) != 0:
            raise AssertionError(migrate.output)

    def scheduler(self, *tasks: str) -> Process:
        process = launch(*tasks, env=self.env)
        self.addCleanup(process.kill)
        return process

    def executions(self, task: str) -> list[tuple[datetime, datetime]]:
        """Return (fire_time, started) of the calls of *task*, in UTC."""
        rows = self.database.query(
            f"SELECT fire_time, started FROM testapp_execution WHERE task = '{task}'"
        )
        return [(_utc(fire), _utc(started)) for fire, started in rows]

    def test_an_unlocked_task_backs_off_while_the_database_is_unavailable(self):
        task = "unlocked_every_2s"
        process = self.scheduler(task)
        process.wait_for("Scheduler running")
        poll(lambda: self.executions(task), timeout=30, message=f"{task} did not run")
        before = len(process.lines)
        down = time.monotonic()
        self.database.make_unavailable()
        time.sleep(6)  # the outage
        self.database.make_available()
        outage = time.monotonic() - down
        back = datetime.now(UTC)
        attempts = [
            line
            for line in process.output.splitlines()[before:]
            # A firing that backs off, or a run that failed (a run under way when the database
            # went also says that its end waits to be recorded: that is not another attempt).
            if task in line and ("Not running" in line or " failed after " in line)
        ]
        self.assertGreater(len(attempts), 0, f"{task} did not meet the outage")
        # One attempt, then one after 1, 2, 4... seconds: log2 of the outage, and some slack.
        limit = math.floor(math.log2(outage + 1)) + 2
        self.assertLessEqual(
            len(attempts),
            limit,
            f"{len(attempts)} lines in {outage:.1f}s:\n" + "\n".join(attempts[:10]),
        )
        poll(
            lambda: any(started > back for _, started in self.executions(task)),
            timeout=20,
            message=f"{task} did not run again after the outage",
        )
        self.assertEqual(process.stop(), 0, process.output)

    @pytest.mark.vendor("mysql")
    def test_schedulers_resume_as_soon_as_the_database_answers_again(self):
        tasks = ("every_second_rate", "every_second_cron", "every_second_delay")
        processes = [self.scheduler(*tasks) for _ in range(2)]
        for process in processes:
            process.wait_for("Scheduler running")
        poll(lambda: all(len(self.executions(task)) >= 2 for task in tasks), timeout=30)
        self.database.make_unavailable()
        down = datetime.now(UTC)  # nothing is written from here until the server is back
        # Wait until each task backs off 8 s on each scheduler (its fourth failed attempt in a
        # row): had nothing woken it, it would try again only that long after.
        for process in processes:
            for task in tasks:
                # Alone: "Not running <task> (scheduled for ...)"; with others that failed
                # alike: "Not running 3 firings (<task>, ...)".
                backs_off = re.compile(rf"Not running (.*[(, ])?{re.escape(task)}[ ,)].*in 8s$")
                poll(
                    lambda process=process, backs_off=backs_off: any(
                        backs_off.search(line) for line in process.output.splitlines()
                    ),
                    timeout=30,
                    message=f"{task} did not back off to 8s:\n{process.output[-3000:]}",
                )
        self.database.make_available()
        back = datetime.now(UTC)
        for task in tasks:
            first = poll(
                lambda task=task: min(
                    (s for _, s in self.executions(task) if s > down), default=None
                ),
                timeout=30,
                message=f"{task} did not run again after the outage",
            )
            self.assertLess(first - back, timedelta(seconds=2), f"{task} resumed late")
        for process in processes:
            self.assertEqual(process.stop(), 0, process.output)
        for task in tasks:
            times = [fire for fire, _ in self.executions(task)]
            self.assertEqual([t for t, n in Counter(times).items() if n > 1], [], task)


def _utc(value: datetime | str | None) -> datetime | None:
    """Return a datetime read from a raw row (naive UTC, or SQLite's text) as aware UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
