"""Frozen, killed and interrupted processes, with real ``runscheduler`` and ``runserver``.

Each test starts the processes with only the task it watches (tests/testapp/tasks.py, declared
when ``TESTAPP_RELIABILITY`` names it), a two-second ``lock_at_most_for`` where the lock has to
expire, and housekeeping every second. The tasks write a row per call with the fire time they
serve (``Execution``); the checks look at those rows and at the run history.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sqlite3
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import TransactionTestCase

from django_scheduling.models import (
    RunStatus,
    ScheduledTask,
    SchedulerInstance,
    TaskLock,
    TaskRun,
)

from .processes import Process, manage, poll, process_env
from .testapp.models import Execution

# Every database on Django 6.1 only: among the suite's slowest tests, whose subject is the
# processes and the database, not the Django version (test_multi_instance.py keeps Django 5.2).
pytestmark = [pytest.mark.processes, pytest.mark.sessions("6.1")]

SECOND = timedelta(seconds=1)
AUTOSTARTED_PID = re.compile(r"Scheduler autostarted in process (\d+)")
SERVER_READY = "Quit the server with"


def scheduling_env(tasks: list[str], log_level: str = "INFO", **scheduling: str) -> dict[str, str]:
    """Return the environment of a process that runs only *tasks*, with housekeeping every
    second and the other SCHEDULING keys given."""
    return process_env(
        TESTAPP_TASKS="",
        TESTAPP_RELIABILITY=",".join(tasks),
        SCHEDULING_LOG_LEVEL=log_level,
        SCHEDULING_EXTRA=json.dumps({"HOUSEKEEPING_INTERVAL": "1s", **scheduling}),
    )


def freeze(process: Process, timeout: float = 10.0) -> None:
    """SIGSTOP *process* at a moment when it holds no SQLite lock.

    A process stopped in the middle of a statement on SQLite keeps the database file locked
    and blocks every writer; stopped and woken again until it is caught between statements.
    MariaDB finishes a statement without its client.
    """
    deadline = time.monotonic() + timeout
    while True:
        process.signal(signal.SIGSTOP)
        if connection.vendor != "sqlite" or sqlite_is_free():
            return
        process.signal(signal.SIGCONT)
        if time.monotonic() > deadline:
            raise AssertionError("the process kept the SQLite database locked")
        time.sleep(0.05)  # let it finish its statement before stopping it again


def sqlite_is_free() -> bool:
    db = sqlite3.connect(connection.settings_dict["NAME"], timeout=1, isolation_level=None)
    try:
        db.execute("BEGIN EXCLUSIVE")
        db.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


def task_row(name: str) -> dict:
    """Return what a run's end may write in the row of task *name*."""
    return ScheduledTask.objects.values(
        "last_fire_time", "last_run_id", "last_finished_at", "next_fire_time"
    ).get(name=name)


def recovery_asked(name: str) -> bool:
    return ScheduledTask.objects.filter(name=name, recover_run__isnull=False).exists()


def assert_no_fire_time_twice(test: TransactionTestCase, task: str) -> None:
    times = Execution.objects.filter(task=task).values_list("fire_time", flat=True)
    test.assertIsNone(Execution.objects.filter(task=task, fire_time__isnull=True).first())
    test.assertEqual([t for t, n in Counter(times).items() if n > 1], [], f"{task} ran twice")


def alive(pid: int) -> bool:
    """Return whether *pid* runs; a zombie waiting for its parent does not."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


class ReliabilityProcessTests(TransactionTestCase):
    maxDiff = None

    def scheduler(self, env: dict[str, str], *tasks: str) -> Process:
        process = manage("runscheduler", *[f"--task={task}" for task in tasks], env=env)
        self.addCleanup(process.kill)
        return process

    def start(self, count: int, tasks: list[str], **env: str) -> list[Process]:
        processes = [self.scheduler(scheduling_env(tasks, **env), *tasks) for _ in range(count)]
        for process in processes:
            process.wait_for("Scheduler running")
        return processes

    def test_a_frozen_holder_is_told_it_lost_its_lock_and_cannot_overwrite_the_newer_run(self):
        # Logging at WARNING: what the processes log is a warning or worse.
        processes = self.start(2, ["frozen"], log_level="WARNING")
        stale = poll(lambda: Execution.objects.filter(task="frozen").first(), timeout=30)
        holder = next(p for p in processes if p.popen.pid == stale.pid)
        other = next(p for p in processes if p is not holder)
        # Not while its first heartbeat is being written: frozen inside a write, it would hold
        # SQLite's write lock and stop every other process (the next one is 30 s later).
        poll(
            lambda: SchedulerInstance.objects.filter(pid=holder.popen.pid).exists(),
            timeout=20,
            message="the holder wrote no heartbeat",
        )
        # Frozen longer than lock_at_most_for (2s): its lock expires, the other instance
        # takes it and runs a later fire time.
        freeze(holder)
        stale.refresh_from_db()
        self.assertIsNone(stale.finished, "the run ended before its process was frozen")
        stale_run = TaskRun.objects.get(task_name="frozen", scheduled_at=stale.fire_time)
        newer = poll(
            lambda: Execution.objects.filter(task="frozen", pid=other.popen.pid).first(),
            timeout=20,
            message="the other instance did not run the task while its holder was frozen",
        )
        self.assertGreater(newer.fire_time, stale.fire_time)
        # Stopped, the other instance no longer writes the task's row: what changes it from
        # here on is the stale run's end.
        self.assertEqual(other.stop(), 0, other.output)
        before = task_row("frozen")
        # SIGTERM waits while the process is stopped: once woken, it finishes the stale run
        # and stops without starting another.
        holder.signal(signal.SIGTERM)
        holder.signal(signal.SIGCONT)
        self.assertEqual(holder.wait(), 0, holder.output)

        self.assertEqual(task_row("frozen"), before, "the stale run overwrote the newer state")
        last_run = TaskRun.objects.get(pk=before["last_run_id"])
        self.assertEqual(last_run.scheduled_at, before["last_fire_time"])
        self.assertEqual(last_run.finished_at, before["last_finished_at"])
        self.assertNotEqual(last_run.instance, stale_run.instance)
        stale_run.refresh_from_db()
        self.assertTrue(stale_run.lock_lost)
        self.assertEqual(stale_run.status, RunStatus.SUCCEEDED)  # it did run to its end
        self.assertEqual(
            list(TaskRun.objects.filter(instance=stale_run.instance).values_list("pk", flat=True)),
            [stale_run.pk],
            "the frozen process ran the task again",
        )
        self.assertFalse(
            TaskRun.objects.filter(instance=last_run.instance, lock_lost=True).exists()
        )
        warnings = [
            line
            for line in holder.lines
            if f"Run {stale_run.pk} of frozen" in line and "lost its lock" in line
        ]
        self.assertEqual(len(warnings), 1, holder.output)
        self.assertIn(f"run {last_run.pk} may have overlapped it", warnings[0])
        assert_no_fire_time_twice(self, "frozen")

    def test_a_killed_run_is_lost_while_another_instance_holds_the_lock_back_to_back(self):
        # Names of other hosts, as far as the processes can tell: no instance can see that
        # the other one died, and the lock has to expire.
        names = ["scheduler-a", "scheduler-b"]
        processes = [
            self.scheduler(scheduling_env(["back_to_back"], INSTANCE_NAME=name), "back_to_back")
            for name in names
        ]
        for process in processes:
            process.wait_for("Scheduler running")
        holder_pid = poll(
            lambda: (
                Execution.objects.filter(task="back_to_back").values_list("pid", flat=True).first()
            ),
            timeout=30,
        )
        holder = next(p for p in processes if p.popen.pid == holder_pid)
        holder_name = names[processes.index(holder)]
        survivor = next(p for p in processes if p is not holder)
        # A run that started less than half a second ago: the kill comes in its middle.
        poll(
            lambda: Execution.objects.filter(
                task="back_to_back",
                pid=holder_pid,
                finished__isnull=True,
                started__gt=datetime.now(UTC) - timedelta(milliseconds=500),
            ).exists(),
            timeout=20,
            interval=0.05,
        )
        holder.kill()
        killed_at = time.monotonic()
        killed = TaskRun.objects.get(
            task_name="back_to_back", instance=holder_name, status=RunStatus.RUNNING
        )
        poll(
            lambda: TaskRun.objects.filter(pk=killed.pk, status=RunStatus.LOST).exists(),
            timeout=10,
            message="the killed run was still running 10s after the kill",
        )
        # Its lock expired after at most 2s, the survivor took it within 1s and housekeeping
        # runs every second.
        self.assertLess(time.monotonic() - killed_at, 6)

        def runs_since_the_kill() -> list[Execution] | None:
            runs = list(
                Execution.objects.filter(task="back_to_back", pid=survivor.popen.pid)
                .filter(fire_time__gt=killed.scheduled_at, finished__isnull=False)
                .order_by("fire_time")
            )
            return runs if len(runs) >= 3 else None

        later = poll(runs_since_the_kill, timeout=20)
        # The survivor took the lock again as soon as each of its runs released it: the lock
        # was free only for moments, so its expiry alone would not tell the killed run.
        gaps = [b.started - a.finished for a, b in itertools.pairwise(later)]
        self.assertLess(max(gaps), SECOND, gaps)
        self.assertEqual(survivor.stop(), 0, survivor.output)
        killed.refresh_from_db()
        self.assertEqual(killed.status, RunStatus.LOST)
        self.assertFalse(
            TaskRun.objects.filter(task_name="back_to_back", status=RunStatus.RUNNING).exists()
        )
        assert_no_fire_time_twice(self, "back_to_back")

    def test_a_killed_run_runs_again_once_with_recover_and_never_without(self):
        tasks = ["recovered", "not_recovered"]
        # The first instance alone: it holds both tasks' runs when it is killed.
        holder = self.scheduler(scheduling_env(tasks), *tasks)
        holder.wait_for("Scheduler running")
        killed = {
            task: poll(lambda task=task: Execution.objects.filter(task=task).first(), timeout=30)
            for task in tasks
        }
        survivor = self.scheduler(scheduling_env(tasks), *tasks)
        survivor.wait_for("Scheduler running")
        for task, execution in killed.items():
            self.assertEqual(execution.pid, holder.popen.pid, task)
            execution.refresh_from_db()
            self.assertIsNone(execution.finished, f"{task} ended before the kill")
        holder.kill()
        lost = {task: TaskRun.objects.get(task_name=task) for task in tasks}

        recovery = poll(
            lambda: Execution.objects.filter(task="recovered", pid=survivor.popen.pid).first(),
            timeout=15,
            message="the lost run of the recover=True task did not run again",
        )
        self.assertEqual(recovery.fire_time, killed["recovered"].fire_time)
        poll(
            lambda: TaskRun.objects.filter(
                pk=lost["not_recovered"].pk, status=RunStatus.LOST
            ).exists(),
            timeout=10,
            message="the killed run of the task without recover was not marked lost",
        )
        # Nothing else may run: watch a few maintenance passes (one a second) go by.
        survivor.wait_for(f"Run {lost['recovered'].pk} of recovered was lost", timeout=1)
        time.sleep(3)  # an absence is seen over a time, not at an event
        self.assertEqual(survivor.stop(), 0, survivor.output)

        runs = list(TaskRun.objects.filter(task_name="recovered").order_by("started_at"))
        self.assertEqual(len(runs), 2, runs)
        first, second = runs
        self.assertEqual(first.pk, lost["recovered"].pk)
        self.assertEqual(first.status, RunStatus.LOST)
        self.assertEqual(second.recovery_of_id, first.pk)
        self.assertEqual(second.scheduled_at, first.scheduled_at)
        self.assertEqual(second.status, RunStatus.SUCCEEDED)  # it stopped with its process
        self.assertEqual(
            list(
                Execution.objects.filter(task="recovered")
                .order_by("pk")  # in the order they ran: the killed run, then its recovery
                .values_list("fire_time", "pid")
            ),
            [
                (killed["recovered"].fire_time, holder.popen.pid),
                (killed["recovered"].fire_time, survivor.popen.pid),
            ],
        )
        self.assertFalse(recovery_asked("recovered"))

        # Without recover=True the lost fire time stays lost: at most once.
        self.assertEqual(
            list(TaskRun.objects.filter(task_name="not_recovered").values_list("pk", "status")),
            [(lost["not_recovered"].pk, RunStatus.LOST)],
        )
        self.assertEqual(Execution.objects.filter(task="not_recovered").count(), 1)
        self.assertFalse(recovery_asked("not_recovered"))
        self.assertEqual(survivor.count("of not_recovered was lost; it runs again"), 0)

    def dev_server(self) -> tuple[Process, int, Execution, TaskRun]:
        """Start ``runserver`` with the scheduler autostarted; return it, its serving child's
        pid, and the child's first call of the three-second task with that call's run."""
        env = scheduling_env(["dev_server"])
        env["SCHEDULING_AUTOSTART"] = "1"
        server = Process(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{free_port()}"], env
        )
        self.addCleanup(server.kill)
        server.wait_for(SERVER_READY)
        child = int(AUTOSTARTED_PID.search(server.wait_for("Scheduler autostarted"))[1])
        call = poll(
            lambda: Execution.objects.filter(task="dev_server", pid=child).first(), timeout=30
        )
        run = TaskRun.objects.get(task_name="dev_server", scheduled_at=call.fire_time)
        call.refresh_from_db()
        self.assertIsNone(call.finished, "the run ended before the interrupt")
        return server, child, call, run

    def test_the_dev_server_stops_its_scheduler_on_its_way_out(self):
        server, child, _, run = self.dev_server()
        # SIGINT to the serving child alone: nothing kills it while it stops, so what it writes
        # on its way out is all there is to see. (Ctrl-C in a terminal also reaches the
        # autoreloader, which kills the child a quarter of a second later: the next test.)
        os.kill(child, signal.SIGINT)
        server.wait(30)
        poll(lambda: not alive(child), timeout=30, message="the serving child did not exit")
        # The run is interrupted and the lock free before any restart could free them.
        run.refresh_from_db()
        self.assertEqual(run.status, RunStatus.INTERRUPTED, server.output)
        self.assertIsNotNone(run.finished_at)
        self.assertLessEqual(TaskLock.objects.get(name="dev_server").lock_until, datetime.now(UTC))

    def test_restarting_the_dev_server_does_not_block_a_running_task(self):
        server, child, first, interrupted = self.dev_server()
        # Ctrl-C in the terminal: SIGINT to the autoreloader and its serving child. The child
        # marks the run interrupted and frees the lock on its way out, unless the autoreloader's
        # kill, a quarter of a second later, comes first; then the restarted server frees the
        # dead child's lock and marks the run lost. Either way the restart is not blocked.
        os.killpg(server.popen.pid, signal.SIGINT)
        server.wait(30)
        poll(lambda: not alive(child), timeout=30, message="the serving child did not exit")

        restarted = Process(server.args, server.env)
        self.addCleanup(restarted.kill)
        started_at = datetime.now(UTC)
        restarted.wait_for(SERVER_READY)
        child = int(AUTOSTARTED_PID.search(restarted.wait_for("Scheduler autostarted"))[1])
        again = poll(
            lambda: Execution.objects.filter(task="dev_server", pid=child).first(),
            timeout=20,
            message="the task did not run again after the restart",
        )
        # Not after lock_at_most_for (10 minutes): within seconds of the new start.
        self.assertLess(again.started - started_at, timedelta(seconds=10))
        self.assertGreater(again.fire_time, first.fire_time)
        poll(
            lambda: TaskRun.objects.filter(
                pk=interrupted.pk, status__in=[RunStatus.INTERRUPTED, RunStatus.LOST]
            ).exists(),
            timeout=10,
            message="the run cut short by Ctrl-C was left running",
        )
        self.assertEqual(restarted.stop(30), 0, restarted.output)
        assert_no_fire_time_twice(self, "dev_server")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
