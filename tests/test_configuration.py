"""Configuration mistakes, as a new project meets them: in real ``manage.py`` and server processes.

A bad ``SCHEDULING`` setting, ``USE_TZ = False``, an invalid task or a database without the
tables stop the scheduler, and only the scheduler: every command still runs, the site keeps
serving, ``manage.py check`` names every problem, and the web processes log them at ERROR.
The projects run ``tests.config_settings`` (the suite's settings plus ``tests.configapp``).
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory

import gunicorn
import pytest
from django.test import TransactionTestCase

from .processes import Process, poll, process_env
from .test_autostart import autostarted_pids, free_port
from .testapp.models import Execution

AUTOSTARTED = "Scheduler autostarted in process"
NOT_STARTING = "ERROR django_scheduling.startup.autostart: The scheduler is not starting"
SERVER_READY = "Quit the server with"
BAD_SETTING = {"CORE_POOL_SIZ": 8, "LOCK_AT_MOST_FOR": "ten minutes"}


def http_status(url: str) -> int | None:
    """Return the HTTP status of GET *url*, or ``None`` while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


class ConfigurationProcessTests(TransactionTestCase):
    pytestmark = pytest.mark.processes

    def start(self, args: list[str], **env: str) -> Process:
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.config_settings",
            "SCHEDULING_LOG_LEVEL": "INFO",
            "TESTAPP_SLOW_SECONDS": "0",
            **env,
        }
        proc = Process(args, process_env(**env))
        self.addCleanup(proc.kill)
        return proc

    def manage(self, *args: str, **env: str) -> Process:
        return self.start([sys.executable, "manage.py", *args], **env)

    def gunicorn(self, *python_options: str, **env: str) -> tuple[Process, str]:
        """Start gunicorn with one worker; return it and the URL of the admin's login page."""
        options = ["--no-control-socket"] if gunicorn.version_info >= (25, 1) else []
        port = free_port()
        args = [sys.executable, *python_options, "-m", "gunicorn", *options]
        args += ["--workers", "1", "--bind", f"127.0.0.1:{port}"]
        proc = self.start([*args, "example_project.wsgi:application"], **env)
        return proc, f"http://127.0.0.1:{port}/admin/login/"

    def assert_serves(self, url: str, proc: Process) -> None:
        try:
            poll(lambda: http_status(url) == 200, timeout=60, interval=0.25)
        except AssertionError:
            self.fail(f"{url} did not answer 200:\n{proc.output}")

    def assert_exit(self, proc: Process, *, ok: bool) -> None:
        code = proc.wait(90)
        self.assertEqual(code == 0, ok, f"exit status {code}:\n{proc.output}")
        self.assertNotIn("Traceback", proc.output)

    # -- a bad SCHEDULING setting ----------------------------------------------------------------

    def test_a_bad_setting_is_named_by_check_and_breaks_no_command(self):
        setting = {"CONFIG_SCHEDULING": json.dumps(BAD_SETTING)}
        check = self.manage("check", **setting)
        migrate = self.manage("migrate", "--noinput", **setting)
        shell = self.manage("shell", "--command", "print('shell ran')", **setting)

        self.assert_exit(check, ok=False)
        problems = [line for line in check.lines if "(django_scheduling.E004)" in line]
        self.assertEqual(len(problems), 2, check.output)
        unknown, duration = sorted(problems, key=lambda line: "CORE_POOL_SIZ" not in line)
        self.assertIn(
            "SCHEDULING has an unknown key 'CORE_POOL_SIZ'; did you mean 'CORE_POOL_SIZE'?",
            unknown,
        )
        self.assertIn("invalid SCHEDULING['LOCK_AT_MOST_FOR'] 'ten minutes'", duration)

        # migrate has nothing to do with the scheduler: it runs and shows the problems.
        self.assert_exit(migrate, ok=True)
        self.assertEqual(migrate.count("(django_scheduling.E004)"), 2, migrate.output)
        self.assert_exit(shell, ok=True)
        self.assertIn("shell ran", shell.lines)

    def test_a_setting_that_is_not_a_dict(self):
        setting = {"CONFIG_SCHEDULING": json.dumps("yes")}
        check = self.manage("check", **setting)
        migrate = self.manage("migrate", "--noinput", **setting)

        self.assert_exit(check, ok=False)
        line = check.wait_for("(django_scheduling.E004)")
        self.assertIn("SCHEDULING must be a dict, got 'yes'", line)
        self.assert_exit(migrate, ok=True)

    def test_a_bad_setting_in_a_web_process(self):
        proc, url = self.gunicorn(
            CONFIG_SCHEDULING=json.dumps({**BAD_SETTING, "AUTOSTART": True}),
            SCHEDULING_AUTOSTART="1",
        )
        self.assert_serves(url, proc)
        proc.wait_for(NOT_STARTING)
        self.assertIn("did you mean 'CORE_POOL_SIZE'?", proc.output)
        self.assertEqual(proc.count(AUTOSTARTED), 0, proc.output)

    # -- USE_TZ = False --------------------------------------------------------------------------

    def test_use_tz_false_stops_the_scheduler_in_every_process(self):
        env = {"CONFIG_USE_TZ": "0", "SCHEDULING_AUTOSTART": "1"}
        web, url = self.gunicorn(**env)
        runscheduler = self.manage("runscheduler", **env)
        check = self.manage("check", **env)

        self.assert_serves(url, web)
        web.wait_for(NOT_STARTING)
        self.assertIn("(django_scheduling.E006) django_scheduling needs USE_TZ = True", web.output)
        self.assertNotIn("ValueError", web.output)
        self.assertEqual(web.count(AUTOSTARTED), 0, web.output)
        for proc in (runscheduler, check):
            with self.subTest(command=proc.args[2]):
                self.assert_exit(proc, ok=False)
                self.assertIn("(django_scheduling.E006)", proc.output)

    # -- an invalid task -------------------------------------------------------------------------

    def assert_refuses_with_the_bad_task(self, proc: Process) -> None:
        line = proc.wait_for(NOT_STARTING)
        self.assertIn("fix these first", line)
        self.assertIn(
            "(django_scheduling.E001) Task 'config.bad_cron' (tests.configapp.tasks.bad_cron): "
            "invalid cron expression '0 0 25 * * *'",
            proc.output,
        )
        self.assertEqual(proc.count(AUTOSTARTED), 0, proc.output)

    def test_gunicorn_serves_with_an_invalid_task(self):
        proc, url = self.gunicorn(CONFIG_TASKS="invalid", SCHEDULING_AUTOSTART="1")
        self.assert_serves(url, proc)
        self.assert_refuses_with_the_bad_task(proc)
        self.assertIsNone(proc.popen.poll(), proc.output)

    def test_runserver_serves_with_an_invalid_task(self):
        port = free_port()
        proc = self.manage(
            "runserver", f"127.0.0.1:{port}", CONFIG_TASKS="invalid", SCHEDULING_AUTOSTART="1"
        )
        proc.wait_for(SERVER_READY)
        self.assert_serves(f"http://127.0.0.1:{port}/admin/login/", proc)
        self.assert_refuses_with_the_bad_task(proc)
        # runserver's own system checks show the problem, as a warning that lets it serve.
        self.assertIn("WARNINGS:", proc.output)

    def test_commands_with_an_invalid_task(self):
        env = {"CONFIG_TASKS": "invalid"}
        status = self.manage("scheduling_status", **env)
        runscheduler = self.manage("runscheduler", **env)
        shell = self.manage("shell", "--command", "print('shell ran')", **env)

        self.assertEqual(status.wait(90), 1, status.output)
        self.assertIn("The scheduler cannot start", status.output)
        self.assertIn("(django_scheduling.E001) Task 'config.bad_cron'", status.output)
        self.assertNotEqual(runscheduler.wait(90), 0, runscheduler.output)
        self.assertIn("(django_scheduling.E001) Task 'config.bad_cron'", runscheduler.output)
        self.assertNotIn("Scheduler running", runscheduler.output)
        self.assert_exit(shell, ok=True)
        self.assertFalse(Execution.objects.exists())

    # -- @scheduled misused: a keyword it does not take, no parentheses, a wrong type ----------

    def test_gunicorn_serves_when_scheduled_is_misused_and_check_names_the_fix(self):
        web, url = self.gunicorn(CONFIG_TASKS="misused", SCHEDULING_AUTOSTART="1")
        check = self.manage("check", CONFIG_TASKS="misused")
        migrate = self.manage("migrate", "--noinput", CONFIG_TASKS="misused")

        self.assert_serves(url, web)
        web.wait_for(NOT_STARTING)
        self.assertIn("did you mean zone=?", web.output)
        self.assertEqual(web.count(AUTOSTARTED), 0, web.output)
        self.assertIsNone(web.popen.poll(), web.output)
        self.assertNotIn("Traceback", web.output)

        self.assert_exit(check, ok=False)
        misuses = [line for line in check.lines if "(django_scheduling.E0" in line]
        self.assertEqual(len(misuses), 3, check.output)
        self.assertIn(
            "Task 'config.typo' (tests.configapp.tasks.typo): @scheduled() got an unknown option "
            "timezone='Europe/Berlin'; did you mean zone=?",
            check.output,
        )
        self.assertIn(
            "Task 'tests.configapp.tasks.bare': @scheduled needs its options in parentheses",
            check.output,
        )
        self.assertIn("cron=5 must be a cron expression in a string", check.output)
        # migrate has nothing to do with the scheduler: it runs, and shows them as warnings.
        self.assert_exit(migrate, ok=True)
        self.assertIn("did you mean zone=?", migrate.output)

    # -- the start thread ------------------------------------------------------------------------

    def test_autostart_waits_for_app_loading_to_finish(self):
        # The app after django_scheduling holds app loading open for up to 3 s, until another
        # thread queries the database. Under -W error that query would raise.
        proc, url = self.gunicorn("-W", "error", SCHEDULING_AUTOSTART="1", CONFIG_READY_PROBE="3")
        self.assert_serves(url, proc)
        [worker] = poll(lambda: autostarted_pids(proc), timeout=30)
        try:
            poll(lambda: Execution.objects.filter(pid=worker).exists(), timeout=30)
        except AssertionError:
            self.fail(f"no task ran in the worker:\n{proc.output}")
        self.assertNotIn("during app initialization", proc.output)
        self.assertNotIn("Traceback", proc.output)

    def test_before_migrate_the_log_says_to_migrate(self):
        with TemporaryDirectory() as directory:
            empty = Path(directory) / "empty.sqlite3"
            proc, url = self.gunicorn(
                DATABASE_URL=f"sqlite:///{empty}", SCHEDULING_AUTOSTART="1", TESTAPP_TASKS=""
            )
            self.assert_serves(url, proc)
            line = proc.wait_for("Cannot start the scheduler")
            self.assertIn("ERROR", line)
            self.assertIn("no such table", line)
            self.assertIn("run `python manage.py migrate`", line)
            proc.kill()
