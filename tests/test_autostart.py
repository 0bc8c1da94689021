"""Autostart starts the scheduler in the processes that serve the project, and only there.

``serving_mode()`` returns ``"no"`` whenever pytest is imported, so its other branches are
checked in a fresh interpreter, and the real servers (``runserver``, gunicorn with and without
``--preload``) and other management commands are started as subprocesses against the test
database.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from unittest import mock

import gunicorn
import pytest
from django.db import DatabaseError, OperationalError, ProgrammingError, connection
from django.test import SimpleTestCase, TransactionTestCase

from django_scheduling.startup.argv import serving_mode
from django_scheduling.startup.autostart import _stop_on_interrupt
from django_scheduling.storage.errors import describe_database_error, missing_table

from .processes import ROOT, Process, poll, process_env
from .testapp.models import Execution

AUTOSTARTED = "Scheduler autostarted in process"
AUTOSTARTED_PID = re.compile(r"Scheduler autostarted in process (\d+)")
BOOTED_PID = re.compile(r"Booting worker with pid: (\d+)")
SERVER_READY = "Quit the server with"

RUNSERVER = ["manage.py", "runserver", "127.0.0.1:8000"]
GUNICORN_ARGS = ["--workers", "2", "example_project.wsgi:application"]
SITE_PACKAGES = "/venv/lib/python3.11/site-packages"

# (argv, environ, expected), evaluated in an interpreter without pytest.
SERVING_MODE_CASES = [
    (RUNSERVER, {}, "no"),  # the autoreloader's parent only watches files
    (RUNSERVER, {"RUN_MAIN": "true"}, "now"),  # the autoreloader's serving child
    (["manage.py", "runserver", "--noreload"], {}, "now"),
    (["django-admin", "runserver"], {"RUN_MAIN": "true"}, "now"),
    ([f"{SITE_PACKAGES}/django/__main__.py", "runserver", "--noreload"], {}, "now"),
    (["manage.py", "migrate"], {}, "no"),
    (["manage.py", "migrate"], {"RUN_MAIN": "true"}, "no"),
    (["manage.py", "makemigrations"], {}, "no"),
    (["manage.py", "shell"], {}, "no"),
    (["manage.py", "check"], {}, "no"),
    (["manage.py", "test"], {}, "no"),
    (["manage.py", "collectstatic", "--noinput"], {}, "no"),
    (["manage.py", "runscheduler"], {}, "no"),
    (["django-admin", "migrate"], {}, "no"),
    (["manage.py"], {}, "no"),
    (["/venv/bin/gunicorn", *GUNICORN_ARGS], {}, "now"),
    ([f"{SITE_PACKAGES}/gunicorn/__main__.py", *GUNICORN_ARGS], {}, "now"),  # python -m
    (["/venv/bin/uvicorn", "example_project.asgi:application"], {}, "now"),
    ([f"{SITE_PACKAGES}/uvicorn/__main__.py", "example_project.asgi:application"], {}, "now"),
    (["daphne", "example_project.asgi:application"], {}, "now"),
    (["/venv/bin/waitress-serve", "example_project.wsgi:application"], {}, "now"),
    ([f"{SITE_PACKAGES}/waitress/__main__.py", "example_project.wsgi:application"], {}, "now"),
    (["/venv/bin/pytest"], {}, "no"),
    ([f"{SITE_PACKAGES}/pytest/__main__.py", "-q"], {}, "no"),
    (["worker.py"], {}, "no"),  # a script that calls django.setup()
    (["-c"], {}, "no"),
    ([], {}, "no"),
]

EVALUATE = """
import json, sys
from django_scheduling.startup.argv import serving_mode
assert "pytest" not in sys.modules
cases = json.load(sys.stdin)
json.dump([serving_mode(argv, environ) for argv, environ, _ in cases], sys.stdout)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def autostarted_pids(proc: Process) -> list[int]:
    return [int(match[1]) for match in AUTOSTARTED_PID.finditer(proc.output)]


def alive(pid: int) -> bool:
    """Return whether *pid* runs; a zombie waiting for its parent does not."""
    if not os.path.isdir("/proc"):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


class ServingModeTests(SimpleTestCase):
    def test_never_serves_under_pytest(self):
        for argv, environ, _ in SERVING_MODE_CASES:
            with self.subTest(argv=argv, environ=environ):
                self.assertEqual(serving_mode(argv, environ), "no")

    @pytest.mark.processes
    def test_modes_outside_pytest(self):
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
        completed = subprocess.run(
            [sys.executable, "-c", EVALUATE],
            input=json.dumps(SERVING_MODE_CASES),
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=60,
            check=False,
        )
        self.assertEqual(completed.returncode, 0, completed.stderr)
        modes = json.loads(completed.stdout)
        for (argv, environ, expected), mode in zip(SERVING_MODE_CASES, modes, strict=True):
            with self.subTest(argv=argv, environ=environ):
                self.assertEqual(mode, expected)


class AutostartProcessTests(TransactionTestCase):
    """Real processes with ``SCHEDULING['AUTOSTART']`` on, against the test database."""

    pytestmark = pytest.mark.processes

    def start(self, args: list[str], autostart: str = "1") -> Process:
        env = process_env(
            SCHEDULING_AUTOSTART=autostart,
            SCHEDULING_LOG_LEVEL="INFO",
            # The slow tasks return at once, so that a graceful stop need not wait for them.
            TESTAPP_SLOW_SECONDS="0",
        )
        proc = Process(args, env)
        self.addCleanup(proc.kill)
        return proc

    def manage(self, *args: str, autostart: str = "1") -> Process:
        return self.start([sys.executable, "manage.py", *args], autostart)

    def gunicorn(self, *options: str) -> Process:
        if gunicorn.version_info >= (25, 1):
            # Each instance would otherwise listen on the same ~/.gunicorn/gunicorn.ctl.
            options = ("--no-control-socket", *options)
        return self.start(
            [
                sys.executable,
                "-m",
                "gunicorn",
                *options,
                "--workers",
                "2",
                "--bind",
                f"127.0.0.1:{free_port()}",
                "example_project.wsgi:application",
            ]
        )

    def assert_tasks_run_in(self, pids: list[int]) -> None:
        """Wait until a task has run in each of *pids*.

        In each, not in any: a gunicorn worker that gets SIGTERM between its fork and setting
        its own signal handlers loses it (the master's handler, inherited, only queues it), and
        runs on until the master kills it. A worker whose scheduler has run a task is past that.
        """
        poll(
            lambda: (
                set(Execution.objects.filter(pid__in=pids).values_list("pid", flat=True))
                == set(pids)
            ),
            timeout=30,
            message=f"a task did not run in each of the processes {pids}",
        )

    def assert_stopped(self, pid: int) -> None:
        poll(lambda: not alive(pid), timeout=30, message=f"process {pid} is still running")

    def test_runserver_starts_it_in_the_serving_child_only(self):
        proc = self.manage("runserver", f"127.0.0.1:{free_port()}")
        proc.wait_for(AUTOSTARTED)
        proc.wait_for(SERVER_READY)
        # The parent ran ready() before it started the child, so its line would come first.
        [child] = autostarted_pids(proc)
        self.assertNotEqual(child, proc.popen.pid)
        self.assert_tasks_run_in([child])
        self.assertEqual(proc.count(AUTOSTARTED), 1, proc.output)
        # SIGTERM to the parent, as a supervisor sends it, stops the child too.
        self.assertEqual(proc.stop(30), 0, proc.output)
        self.assert_stopped(child)

    def test_runserver_noreload_starts_it_in_its_process(self):
        proc = self.manage("runserver", "--noreload", f"127.0.0.1:{free_port()}")
        proc.wait_for(SERVER_READY)
        self.assertEqual(autostarted_pids(proc), [proc.popen.pid], proc.output)
        self.assert_tasks_run_in([proc.popen.pid])
        proc.stop(30)

    def test_runserver_without_autostart(self):
        proc = self.manage("runserver", "--noreload", f"127.0.0.1:{free_port()}", autostart="0")
        proc.wait_for(SERVER_READY)
        self.assertEqual(proc.count(AUTOSTARTED), 0, proc.output)
        proc.stop(30)

    def check_gunicorn(self, *options: str) -> None:
        proc = self.gunicorn(*options)
        # With --preload a worker autostarts right after the fork, before it logs "Booting".
        try:
            # Each worker logs "Booting worker" after its scheduler autostarted: wait for both.
            poll(
                lambda: proc.count(AUTOSTARTED) >= 2 and proc.count("Booting worker") >= 2,
                timeout=30,
            )
        except AssertionError:
            self.fail(f"two workers did not boot and autostart:\n{proc.output}")
        workers = autostarted_pids(proc)
        self.assertEqual(len(set(workers)), 2, proc.output)
        self.assertNotIn(proc.popen.pid, workers)
        booted = {int(match[1]) for match in BOOTED_PID.finditer(proc.output)}
        self.assertEqual(set(workers), booted, proc.output)
        self.assert_tasks_run_in(workers)

        self.assertEqual(proc.stop(60), 0, proc.output)
        self.assertEqual(proc.count(AUTOSTARTED), 2, proc.output)
        self.assertEqual(proc.count("Scheduler stopped"), 2, proc.output)
        for pid in workers:
            self.assert_stopped(pid)

    def test_gunicorn_starts_it_in_each_worker(self):
        self.check_gunicorn()

    def test_gunicorn_preload_starts_it_in_each_worker_after_the_fork(self):
        self.check_gunicorn("--preload")

    def test_other_commands_never_start_it(self):
        commands = [
            ["migrate"],
            ["check"],
            ["showmigrations", "django_scheduling"],
            ["shell", "--command", "print('shell ran')"],
        ]
        # Concurrently, to save start-up time.
        started = [(command, self.manage(*command)) for command in commands]
        for command, proc in started:
            with self.subTest(command=command[0]):
                self.assertEqual(proc.wait(60), 0, proc.output)
                self.assertEqual(proc.count(AUTOSTARTED), 0, proc.output)


def job():
    pass


class StartThreadTests(TransactionTestCase):
    """The thread that starts an autostarted scheduler never gives up for good."""

    def test_any_exception_is_logged_and_retried(self):
        from django_scheduling.conf import SchedulingSettings
        from django_scheduling.runtime.service import SchedulerService
        from django_scheduling.tasks.registry import TaskDefinition, TaskRegistry

        failures = ["once"]

        class FailsOnce(TaskDefinition):
            def trigger(self, *args, **kwargs):
                if failures:
                    raise RuntimeError(f"failed {failures.pop()}")
                return super().trigger(*args, **kwargs)

        task = FailsOnce(name="fails.once", func=job, trigger_options={"fixed_rate": "1h"})
        service = SchedulerService(
            [task], tasks=TaskRegistry(), conf=SchedulingSettings.from_dict({"HISTORY": False})
        )
        self.addCleanup(service.stop, 5)
        with self.assertLogs("django_scheduling.runtime.service", "INFO") as logs:
            service.start_in_background()
            poll(lambda: "Scheduler started" in "\n".join(logs.output), timeout=30)
        [failure] = [line for line in logs.output if line.startswith("ERROR")]
        self.assertIn("Cannot start the scheduler; trying again in 1.0s", failure)
        self.assertIn("RuntimeError: failed once", failure)
        self.assertEqual(list(service.next_fire_times()), ["fails.once"])


class InterruptTests(SimpleTestCase):
    """Under runserver, Ctrl-C starts stopping the scheduler at once, on a thread of its own:
    the autoreloader kills its serving child a quarter of a second later."""

    def install(self, previous) -> threading.Event:
        saved = signal.signal(signal.SIGINT, previous)
        self.addCleanup(signal.signal, signal.SIGINT, saved)
        stopped = threading.Event()
        timeouts = []

        def stop(timeout: float) -> None:
            timeouts.append(timeout)
            stopped.set()

        self.addCleanup(lambda: self.assertEqual(timeouts, [0.0]))
        _stop_on_interrupt(stop)
        return stopped

    def test_ctrl_c_starts_the_stop_and_still_interrupts(self):
        stopped = self.install(signal.default_int_handler)
        with self.assertRaises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        self.assertTrue(stopped.wait(10), "Ctrl-C did not stop the scheduler")

    def test_the_stop_starts_even_when_the_interrupt_is_swallowed(self):
        """Python swallows an exception raised in a finalizer ("Exception ignored in"): the
        main thread goes on serving, and only the stop begun by the handler runs."""
        stopped = self.install(signal.default_int_handler)
        swallowed = []

        class Finalized:
            def __del__(self):
                signal.raise_signal(signal.SIGINT)

        with mock.patch.object(sys, "unraisablehook", swallowed.append):
            Finalized()
        self.assertEqual([type(hook.exc_value) for hook in swallowed], [KeyboardInterrupt])
        self.assertTrue(stopped.wait(10), "the swallowed Ctrl-C did not stop the scheduler")

    def test_an_ignored_sigint_stays_ignored(self):
        """A server started in the background (``&``) ignores SIGINT: so does its scheduler."""
        saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.addCleanup(signal.signal, signal.SIGINT, saved)
        _stop_on_interrupt(lambda timeout: self.fail("an ignored SIGINT stopped the scheduler"))
        self.assertEqual(signal.getsignal(signal.SIGINT), signal.SIG_IGN)

    def test_a_second_ctrl_c_starts_no_second_stop(self):
        stopped = self.install(signal.default_int_handler)
        for _ in range(2):
            with self.assertRaises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        self.assertTrue(stopped.wait(10))  # and the cleanup checks that it stopped once


class MissingTableTests(TransactionTestCase):
    """The start thread tells a missing table (run migrate) from other database errors."""

    def error_of(self, sql: str) -> DatabaseError:
        with self.assertRaises(DatabaseError) as caught, connection.cursor() as cursor:
            cursor.execute(sql)
        return caught.exception

    def test_the_database_in_use(self):
        missing = self.error_of("SELECT name FROM django_scheduling_no_such_table")
        self.assertTrue(missing_table(missing), repr(missing))
        self.assertIn("run `python manage.py migrate`", describe_database_error(missing))
        wrong = self.error_of("SELECT no_such_column FROM django_scheduling_scheduledtask")
        self.assertFalse(missing_table(wrong), repr(wrong))
        self.assertNotIn("migrate", describe_database_error(wrong))

    def test_error_codes_and_texts_of_each_database(self):
        class PsycopgError(Exception):
            def __init__(self, message: str, sqlstate: str) -> None:
                super().__init__(message)
                self.sqlstate = self.pgcode = sqlstate

        def wrapped(cause: Exception) -> DatabaseError:
            try:
                raise ProgrammingError(*cause.args) from cause
            except ProgrammingError as exc:
                return exc

        cases = [
            (OperationalError("no such table: django_scheduling_tasklock"), True),
            (ProgrammingError(1146, "Table 'app.django_scheduling_tasklock' doesn't exist"), True),
            (wrapped(PsycopgError('relation "x" does not exist', "42P01")), True),
            (OperationalError(2002, "Can't connect to server on '127.0.0.1' (115)"), False),
            (wrapped(PsycopgError('column "x" does not exist', "42703")), False),
            (OperationalError("database is locked"), False),
        ]
        for error, expected in cases:
            with self.subTest(error=error):
                self.assertEqual(missing_table(error), expected)
