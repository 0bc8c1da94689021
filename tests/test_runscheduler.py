"""``manage.py runscheduler`` as a real process against the test database."""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from tempfile import TemporaryDirectory
from types import SimpleNamespace

import pytest
from django.test import TransactionTestCase
from django.utils import timezone

from django_scheduling.management.commands import runscheduler
from django_scheduling.models import RunStatus, ScheduledTask, TaskLock, TaskRun

from .processes import Process, manage, poll, process_env
from .testapp.models import Execution

TRIGGERS = {
    "every_second_cron": "cron * * * * * * UTC",
    "every_second_rate": "every 1s",
    "every_second_delay": "1s after each run",
    "slow": "every 1s",
    "stubborn": "every 1h",
}
RUNNING = "Scheduler running"
STOPPED = "Scheduler stopped."


def ran() -> set[str]:
    return set(Execution.objects.values_list("task", flat=True))


class RunschedulerTests(TransactionTestCase):
    pytestmark = pytest.mark.processes

    def runscheduler(self, *args: str, **env: str) -> Process:
        # The slow tasks return at once unless a test asks otherwise.
        env = {"SCHEDULING_LOG_LEVEL": "INFO", "TESTAPP_SLOW_SECONDS": "0", **env}
        proc = manage("runscheduler", *args, env=process_env(**env))
        self.addCleanup(proc.kill)
        return proc

    def started(self, *args: str, **env: str) -> Process:
        proc = self.runscheduler(*args, **env)
        proc.wait_for(RUNNING)
        return proc

    def wait_until(self, predicate, proc: Process, what: str):
        try:
            return poll(predicate, timeout=30)
        except AssertionError:
            self.fail(f"{what}; output:\n{proc.output}")

    def listed(self, proc: Process) -> dict[str, str]:
        """Return the triggers of the tasks that *proc* listed with their next fire time."""
        tasks = {}
        for line in proc.output.splitlines():
            parts = line.strip().split("  ")
            if len(parts) >= 3 and parts[0] in TRIGGERS and parts[-1].startswith("next 20"):
                tasks[parts[0]] = parts[1]
        return tasks

    def assert_listed(self, proc: Process, names) -> None:
        expected = {name: TRIGGERS[name] for name in names}
        self.assertEqual(self.listed(proc), expected, proc.output)

    def assert_stops_gracefully_on(self, signum: int) -> None:
        # AUTOSTART does not matter to runscheduler, and it starts no second scheduler.
        proc = self.started(SCHEDULING_AUTOSTART="1")
        self.assert_listed(proc, TRIGGERS)
        proc.wait_for("Running every_second_rate")

        proc.signal(signum)
        self.assertEqual(proc.wait(30), 0, proc.output)
        self.assertIn(f"Received {signal.Signals(signum).name}, shutting down", proc.output)
        self.assertIn(STOPPED, proc.lines, proc.output)
        self.assertEqual(proc.count("Scheduler autostarted"), 0, proc.output)
        self.assertGreater(TaskRun.objects.filter(task_name="every_second_rate").count(), 0)
        self.assertFalse(TaskRun.objects.filter(status=RunStatus.RUNNING).exists())

    def test_sigterm(self):
        self.assert_stops_gracefully_on(signal.SIGTERM)

    def test_sigint(self):
        self.assert_stops_gracefully_on(signal.SIGINT)

    def test_task_runs_only_that_task(self):
        proc = self.started("--task", "every_second_rate")
        self.assert_listed(proc, {"every_second_rate"})
        self.wait_until(
            lambda: Execution.objects.filter(task="every_second_rate").count() >= 2,
            proc,
            "every_second_rate did not run twice",
        )
        self.assertEqual(proc.stop(30), 0, proc.output)
        self.assertEqual(ran(), {"every_second_rate"})
        runs = set(TaskRun.objects.values_list("task_name", flat=True))
        self.assertEqual(runs, {"every_second_rate"})

    def test_exclude(self):
        proc = self.started("--exclude", "every_second_cron", "--exclude", "stubborn")
        expected = {"every_second_rate", "every_second_delay", "slow"}
        self.assert_listed(proc, expected)
        # A cron firing every second would have run by the second run of every_second_rate.
        self.wait_until(
            lambda: (
                Execution.objects.filter(task="every_second_rate").count() >= 2
                and ran() >= expected
            ),
            proc,
            "the other tasks did not run",
        )
        self.assertEqual(proc.stop(30), 0, proc.output)
        self.assertEqual(ran(), expected)

    def test_list(self):
        cases = {
            (): TRIGGERS.keys(),
            ("--task", "slow", "--task", "stubborn"): {"slow", "stubborn"},
            ("--exclude", "slow"): TRIGGERS.keys() - {"slow"},
        }
        # Concurrently, to save start-up time.
        procs = {args: self.runscheduler("--list", *args) for args in cases}
        for args, proc in procs.items():
            with self.subTest(args=args):
                self.assertEqual(proc.wait(60), 0, proc.output)
                self.assert_listed(proc, cases[args])
                self.assertNotIn(RUNNING, proc.output)
        self.assertFalse(Execution.objects.exists())
        self.assertFalse(TaskRun.objects.exists())

    def test_invalid_options(self):
        unknown = "Unknown task(s): nope. Known tasks: "
        cases = {
            ("--task", "nope"): unknown,
            ("--task", "slow", "--exclude", "nope"): unknown,
            ("--pool-size", "0"): "--pool-size must be at least 1, got 0",
        }
        # Concurrently, to save start-up time.
        procs = {args: self.runscheduler(*args) for args in cases}
        for args, proc in procs.items():
            with self.subTest(args=args):
                self.assertNotEqual(proc.wait(60), 0, proc.output)
                message = proc.wait_for(cases[args])
                if cases[args] == unknown:
                    for name in TRIGGERS:
                        self.assertIn(name, message.partition(unknown)[2])
                self.assertNotIn(RUNNING, proc.output)
        self.assertFalse(Execution.objects.exists())

    def test_sigterm_during_a_run_asks_the_task_to_stop(self):
        proc = self.started("--task", "slow", TESTAPP_SLOW_SECONDS="30")
        execution = self.wait_until(
            lambda: Execution.objects.filter(task="slow", finished__isnull=True).first(),
            proc,
            "slow did not start",
        )
        sent = time.monotonic()
        proc.signal(signal.SIGTERM)
        self.assertEqual(proc.wait(30), 0, proc.output)
        self.assertLess(time.monotonic() - sent, 10, proc.output)
        self.assertNotIn("Still running at shutdown", proc.output)
        execution.refresh_from_db()
        self.assertIsNotNone(execution.finished)
        statuses = list(TaskRun.objects.filter(task_name="slow").values_list("status", flat=True))
        self.assertEqual(statuses, [RunStatus.SUCCEEDED])
        self.assertLessEqual(TaskLock.objects.get(name="slow").lock_until, timezone.now())

    def test_sigterm_with_a_task_that_ignores_it(self):
        proc = self.started(
            "--task", "stubborn", "--shutdown-timeout", "1", TESTAPP_SLOW_SECONDS="30"
        )
        execution = self.wait_until(
            lambda: Execution.objects.filter(task="stubborn").first(),
            proc,
            "stubborn did not start",
        )
        sent = time.monotonic()
        proc.signal(signal.SIGTERM)
        self.assertEqual(proc.wait(30), 0, proc.output)
        self.assertGreaterEqual(time.monotonic() - sent, 1)
        self.assertLess(time.monotonic() - sent, 10, proc.output)
        self.assertIn("Still running at shutdown: stubborn", proc.output)
        # Not silent while it waits: it says for which runs, and for how long at most.
        waiting = proc.wait_for("Stopping: waiting up to", timeout=1)
        self.assertIn("for 1 running task(s): stubborn (running", waiting)
        self.assertIn(STOPPED, proc.lines, proc.output)
        execution.refresh_from_db()
        self.assertIsNone(execution.finished)
        run = TaskRun.objects.get(task_name="stubborn")
        self.assertEqual(run.status, RunStatus.INTERRUPTED)
        self.assertIsNotNone(run.finished_at)


class ListTests(TransactionTestCase):
    """``runscheduler --list`` shows what the database says about each task."""

    pytestmark = pytest.mark.processes

    def list_tasks(self, **env: str) -> Process:
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.config_settings",
            "CONFIG_TASKS": "listing",
            "TESTAPP_TASKS": "",
            **env,
        }
        proc = manage("runscheduler", "--list", env=process_env(**env))
        self.addCleanup(proc.kill)
        return proc

    def test_stored_times_done_one_shots_and_paused_tasks(self):
        once = datetime(2026, 1, 1, 12, tzinfo=UTC)
        stored = (timezone.now() + timedelta(minutes=17)).replace(microsecond=0)
        ScheduledTask.objects.create(
            name="config.once",
            kind="one_shot",
            trigger=f"once at {once.isoformat()}",
            anchor=once,
            last_fire_time=once,
        )
        ScheduledTask.objects.create(
            name="config.hourly",
            kind="fixed_rate",
            trigger="every 1h",
            anchor=stored - timedelta(hours=5),
            next_fire_time=stored,
        )
        ScheduledTask.objects.create(
            name="config.paused",
            kind="fixed_rate",
            trigger="every 1h",
            anchor=stored - timedelta(hours=5),
            next_fire_time=stored,
            paused=True,
        )
        proc = self.list_tasks()
        self.assertEqual(proc.wait(60), 0, proc.output)
        self.assertIn(f"config.hourly  every 1h  next {stored.isoformat()}", proc.lines)
        self.assertIn(f"config.paused  every 1h  paused, next {stored.isoformat()}", proc.lines)
        self.assertIn(
            f"config.once  once at {once.isoformat()}  done: fired at {once.isoformat()}",
            proc.lines,
        )
        self.assertFalse(TaskRun.objects.exists())

    def test_before_migrate(self):
        with TemporaryDirectory() as directory:
            proc = self.list_tasks(DATABASE_URL=f"sqlite:///{Path(directory) / 'empty.sqlite3'}")
            self.assertEqual(proc.wait(60), 0, proc.output)
        self.assertIn("run `python manage.py migrate`", proc.output)
        self.assertNotIn("Traceback", proc.output)
        names = [line.partition("  ")[0] for line in proc.lines if "  " in line]
        self.assertEqual(names, ["config.hourly", "config.once", "config.paused"], proc.output)
        self.assertIn(
            "config.once  once at 2026-01-01T12:00:00+00:00  next 2026-01-01T12:00:00+00:00",
            proc.lines,
        )


class _Every:
    def describe(self) -> str:
        return "every 1s"


class _Service:
    """What ``runscheduler`` lists at start: the started service's tasks and fire times."""

    def __init__(self, count: int) -> None:
        definition = SimpleNamespace(lock=True)
        self.specs = [
            SimpleNamespace(name=f"task{i:03}", trigger=_Every(), definition=definition)
            for i in range(count)
        ]

    def next_fire_times(self) -> dict[str, datetime]:
        return {spec.name: datetime(2026, 1, 1, 12, tzinfo=UTC) for spec in self.specs}


@pytest.mark.parametrize("more", [0, 3])
def test_at_start_a_long_list_of_tasks_is_cut_with_a_count_of_the_rest(more):
    output = StringIO()
    command = runscheduler.Command(stdout=output)
    command._print_tasks(_Service(runscheduler.LISTED_AT_START + more))  # type: ignore[arg-type]
    lines = output.getvalue().splitlines()
    noon = "2026-01-01T12:00:00+00:00"
    count = runscheduler.LISTED_AT_START
    listed = [f"  task{i:03}  every 1s  (locked)  next {noon}" for i in range(count)]
    if not more:
        assert lines == listed
        return
    assert lines[:count] == listed
    assert lines[count:] == [
        "  ... and 3 more tasks: `manage.py runscheduler --list` lists every one."
    ]
