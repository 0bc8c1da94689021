"""``SCHEDULING["SCHEDULE"]``: tasks declared in settings, by dotted path or as management
commands; their mistakes as check errors naming the entry; a command's run and its output,
through the real pipeline and database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.core.management import call_command
from django.test import SimpleTestCase, TransactionTestCase, override_settings

from django_scheduling.checks import task_errors
from django_scheduling.conf import InvalidSettings, SchedulingSettings
from django_scheduling.models import RunStatus, TaskRun
from django_scheduling.tasks import commands
from django_scheduling.tasks.commands import (
    OUTPUT_LIMIT,
    CommandFailed,
    ManagementCommand,
    argument_error,
)
from django_scheduling.tasks.configured import configured
from django_scheduling.tasks.registry import TaskRegistry

from .test_execution import Clock, make_runner

T0 = datetime(2026, 5, 13, 12, 0, 0, tzinfo=UTC)
REPORT = "scheduling_report"


def errors_of(schedule: dict) -> list[tuple[str, str]]:
    """Return the check errors of *schedule* as (id, message)."""
    tasks = TaskRegistry()
    tasks.add_configured(schedule)
    return [(error.id, error.msg) for error in task_errors(tasks)]


class EntryTests(SimpleTestCase):
    def test_a_dotted_path_declares_the_function_with_the_entrys_options(self):
        definition = configured(
            "reports.digest",
            {
                "task": "tests.testapp.tasks.reports_with_arguments",
                "cron": "0 0 7 * * MON-FRI",
                "kwargs": {"full": True},
                "jitter": "5s",
            },
        )
        self.assertIsNone(definition.error)
        self.assertEqual(definition.name, "reports.digest")
        self.assertEqual(definition.origin, "SCHEDULING['SCHEDULE']['reports.digest']")
        self.assertEqual(dict(definition.kwargs), {"full": True})
        self.assertEqual(definition.jitter, timedelta(seconds=5))
        trigger = definition.trigger(UTC)
        self.assertEqual(trigger.kind, "cron")

    def test_a_command_is_declared_with_its_arguments(self):
        definition = configured(
            "reports.nightly",
            {"command": REPORT, "args": ["nightly"], "kwargs": {"count": 2}, "cron": "0 0 4 * * *"},
        )
        self.assertIsNone(definition.error)
        self.assertEqual(definition.func, ManagementCommand(REPORT))
        self.assertEqual((definition.args, dict(definition.kwargs)), (("nightly",), {"count": 2}))

    def test_mistakes_are_check_errors_naming_the_entry_and_the_fix(self):
        found = errors_of(
            {
                "both": {"task": "tests.testapp.tasks.reports_with_arguments", "command": REPORT},
                "neither": {"cron": "0 0 4 * * *"},
                "no.module": {"task": "reports.nowhere.send", "cron": "0 0 4 * * *"},
                "typo.command": {"command": "clearsession", "cron": "0 0 4 * * *"},
                "bad.option": {"command": REPORT, "args": ["x"], "kwargs": {"cuont": 2}},
                "no.positional": {"command": REPORT, "cron": "0 0 4 * * *"},
                "bad.arguments": {
                    "task": "tests.testapp.tasks.reports_with_arguments",
                    "kwargs": {"ful": True},
                    "cron": "0 0 7 * * *",
                },
                "bad.keyword": {
                    "command": "clearsessions",
                    "cron": "0 0 4 * * *",
                    "timezone": "UTC",
                },
                "bad.cron": {"command": "clearsessions", "cron": "0 0 25 * * *"},
            }
        )
        by_entry = {message.split("'")[1]: (code, message) for code, message in found}
        self.assertEqual(len(found), 9, found)
        for name, (_, message) in by_entry.items():
            self.assertIn(f"SCHEDULING['SCHEDULE']['{name}']", message)
        self.assertEqual(by_entry["both"][0], "django_scheduling.E013")
        self.assertIn("both 'task' and 'command'; give one", by_entry["both"][1])
        self.assertIn("neither 'task' nor 'command'", by_entry["neither"][1])
        self.assertIn("'reports.nowhere.send' does not import", by_entry["no.module"][1])
        self.assertIn(
            "no management command 'clearsession'; did you mean 'clearsessions'?",
            by_entry["typo.command"][1],
        )
        self.assertIn(f"manage.py {REPORT} has no option cuont", by_entry["bad.option"][1])
        self.assertIn("count", by_entry["bad.option"][1])  # the options it has
        self.assertIn("the following arguments are required: label", by_entry["no.positional"][1])
        self.assertEqual(by_entry["bad.arguments"][0], "django_scheduling.E009")
        self.assertIn("do not fit the function", by_entry["bad.arguments"][1])
        self.assertEqual(by_entry["bad.keyword"][0], "django_scheduling.E011")
        self.assertIn(
            "unknown option timezone='UTC'; did you mean zone=?", by_entry["bad.keyword"][1]
        )
        self.assertEqual(by_entry["bad.cron"][0], "django_scheduling.E001")

    def test_the_key_is_the_name_and_a_decorated_task_of_that_name_is_a_duplicate(self):
        ((code, message),) = errors_of(
            {"x": {"command": "clearsessions", "cron": "0 0 4 * * *", "name": "y"}}
        )
        self.assertEqual(code, "django_scheduling.E013")
        self.assertIn("its key is the task's name; drop 'name'", message)
        tasks = TaskRegistry()
        tasks.add(lambda: None, name="sessions.clear", fixed_rate="1h")
        tasks.add_configured(
            {"sessions.clear": {"command": "clearsessions", "cron": "0 0 4 * * *"}}
        )
        (duplicate,) = task_errors(tasks)
        self.assertEqual(duplicate.id, "django_scheduling.E002")
        self.assertIn("SCHEDULING['SCHEDULE']['sessions.clear']", duplicate.msg)

    def test_the_setting_must_be_a_dict_of_dicts(self):
        with self.assertRaises(InvalidSettings) as caught:
            SchedulingSettings.from_dict({"SCHEDULE": [("sessions.clear", "clearsessions")]})
        self.assertIn(
            "SCHEDULING['SCHEDULE'] must be a dict of task names to entries", str(caught.exception)
        )
        with self.assertRaises(InvalidSettings) as caught:
            SchedulingSettings.from_dict({"SCHEDULE": {"sessions.clear": "clearsessions"}})
        self.assertIn("SCHEDULING['SCHEDULE']['sessions.clear'] must be", str(caught.exception))

    @override_settings(
        SCHEDULING={
            "SCHEDULE": {"sessions.clear": {"command": "clearsesions", "cron": "0 4 * * *"}}
        }
    )
    def test_the_projects_setting_is_read_as_declared(self):
        from django_scheduling.conf import get_settings

        tasks = TaskRegistry()
        tasks.add_configured(get_settings().schedule)
        (line,) = tasks.errors()
        self.assertIn("task 'sessions.clear' (SCHEDULING['SCHEDULE']['sessions.clear'])", line)
        self.assertIn("did you mean 'clearsessions'?", line)


class CommandTests(SimpleTestCase):
    def test_the_output_of_stdout_and_stderr_is_returned_in_order(self):
        output = ManagementCommand(REPORT)("daily", count=2)
        self.assertIsInstance(output, commands.CommandOutput)
        self.assertEqual(output, "daily line 1\ndaily line 2\ndaily: 2 line(s) written\n")

    def test_a_failure_keeps_the_output_and_the_commands_error(self):
        with self.assertRaises(CommandFailed) as caught:
            ManagementCommand(REPORT)("daily", fail=True)
        failed = caught.exception
        self.assertIn(
            "manage.py scheduling_report failed: CommandError: daily could not finish", str(failed)
        )
        self.assertEqual(failed.output, "daily line 1\ndaily: 1 line(s) written\n")
        self.assertEqual(type(failed.__cause__).__name__, "CommandError")

    def test_an_error_that_names_its_kind_is_not_named_twice(self):
        # SystemCheckError's message begins "SystemCheckError: System check identified ...".
        with self.assertRaises(CommandFailed) as caught:
            ManagementCommand("check")(deploy=True, fail_level="WARNING", tags=["security"])
        message = str(caught.exception)
        self.assertTrue(
            message.startswith("manage.py check failed: SystemCheckError: System check"), message
        )
        self.assertNotIn("SystemCheckError: SystemCheckError", message)

    def test_only_the_last_10_kb_are_kept(self):
        output = ManagementCommand(REPORT)("é" * 50, count=2_000)
        self.assertLessEqual(len(output.encode()), OUTPUT_LIMIT)
        self.assertGreater(len(output.encode()), OUTPUT_LIMIT - 200)
        self.assertTrue(output.startswith("[earlier output cut]\n"))
        self.assertTrue(output.endswith(f"{'é' * 50}: 2000 line(s) written\n"))

    def test_argument_error_answers_as_call_command_would(self):
        self.assertIsNone(argument_error(REPORT, ["x"], {"count": 3, "fail": True}))
        self.assertIsNone(argument_error("clearsessions", [], {}))
        self.assertIn("may not set stdout", argument_error(REPORT, ["x"], {"stdout": None}))
        self.assertIn("invalid int value", argument_error(REPORT, ["x", "--count", "many"], {}))
        call_command(REPORT, "x", count=3)  # what argument_error accepts, call_command runs


class CommandRunTests(TransactionTestCase):
    """A command scheduled in settings, run by the real pipeline: its output is kept with the
    run, whether it succeeds or fails."""

    def run_entry(self, entry: dict) -> TaskRun:
        from django_scheduling.runtime.scheduler import Entry

        runner = make_runner("a", Clock(T0))
        (spec,) = runner.specs([configured("reports.nightly", entry)], complete=False)
        runner.run(Entry(spec.name, spec), T0)
        return TaskRun.objects.get(task_name="reports.nightly")

    def test_a_succeeded_run_keeps_the_output(self):
        run = self.run_entry({"command": REPORT, "args": ["nightly"], "fixed_rate": "1h"})
        self.assertEqual(run.status, RunStatus.SUCCEEDED)
        self.assertEqual(run.output, "nightly line 1\nnightly: 1 line(s) written\n")

    def test_a_failed_run_keeps_the_output_and_the_error(self):
        run = self.run_entry(
            {"command": REPORT, "args": ["nightly"], "kwargs": {"fail": True}, "fixed_rate": "1h"}
        )
        self.assertEqual(run.status, RunStatus.FAILED)
        self.assertEqual(run.output, "nightly line 1\nnightly: 1 line(s) written\n")
        self.assertIn("CommandError: nightly could not finish", run.error_message)

    def test_other_tasks_keep_no_output(self):
        run = self.run_entry(
            {"task": "tests.testapp.tasks.reports_with_arguments", "fixed_rate": "1h"}
        )
        self.assertEqual((run.status, run.output), (RunStatus.SUCCEEDED, ""))
