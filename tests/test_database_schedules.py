"""Schedules kept in the database (``models.Schedule``): what a row may name, the form's
validation, the scheduler's entries replaced and removed, and a running scheduler that applies
created, changed, disabled, deleted and wrong rows. The processes and the admin pages have
tests of their own (test_database_schedules_processes.py, test_admin_schedules*.py)."""

from __future__ import annotations

import dataclasses
import io
import threading
from dataclasses import replace
from datetime import timedelta
from unittest import mock

from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection
from django.test import SimpleTestCase, TestCase, TransactionTestCase, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_scheduling import schedulable
from django_scheduling.checks import settings_errors, task_errors
from django_scheduling.conf import InvalidSettings, SchedulingSettings, get_settings
from django_scheduling.models import Schedule, ScheduledTask, TaskRun
from django_scheduling.runtime.calls import Entry, RunRequest
from django_scheduling.runtime.service import SchedulerService
from django_scheduling.schedules.triggers import FixedRateTrigger, TriggerState
from django_scheduling.tasks.commands import ManagementCommand
from django_scheduling.tasks.registry import TaskRegistry, registry
from django_scheduling.tasks.stored import FIELDS, definition_of

from .processes import poll
from .test_scheduler import MemoryRunner, Task, now, wait_for
from .testapp.tasks import record_stored

COMMANDS = ["scheduling_report"]


def row(**fields) -> dict:
    """Return a row as the schedulers read it: *fields* over a schedule's defaults."""
    defaults = {field.name: field.get_default() for field in Schedule._meta.fields}
    values = {key: defaults[key] for key in FIELDS}
    values.update(fields)
    return values


def send_digest(*, full=False):
    return full


def nightly():
    pass


def code_tasks() -> TaskRegistry:
    """A registry with a code task ``nightly``, and ``send_digest`` as ``reports.digest``."""
    tasks = TaskRegistry()
    tasks.add(nightly, cron="0 0 3 * * *", name="nightly", lock_at_most_for="1h", retries=2)
    tasks.allow(send_digest, "reports.digest")
    return tasks


class DefinitionTests(SimpleTestCase):
    def definition(self, **fields):
        conf = SchedulingSettings.from_dict({"COMMANDS": COMMANDS})
        return definition_of(row(**fields), tasks=code_tasks(), conf=conf)

    def test_a_schedulable_task_with_its_trigger_and_arguments(self):
        definition = self.definition(
            name="digest", task="reports.digest", cron="0 0 7 * * MON-FRI", kwargs={"full": True}
        )
        self.assertIsNone(definition.error)
        self.assertIs(definition.func, send_digest)
        self.assertEqual(definition.trigger_options, {"cron": "0 0 7 * * MON-FRI"})
        self.assertEqual(dict(definition.kwargs), {"full": True})
        self.assertIn("database", definition.origin)

    def test_a_scheduled_tasks_function_may_be_named_too(self):
        definition = self.definition(name="twice", task="nightly", fixed_rate="1h")
        self.assertIsNone(definition.error)
        self.assertIs(definition.func, nightly)

    def test_a_listed_command_with_its_arguments(self):
        definition = self.definition(
            name="report", command="scheduling_report", args=["daily"], fixed_delay="10m"
        )
        self.assertIsNone(definition.error)
        self.assertEqual(definition.func, ManagementCommand("scheduling_report"))
        self.assertEqual(definition.args, ("daily",))

    def test_nothing_the_code_did_not_opt_in_is_taken(self):
        system = self.definition(name="evil", task="os.system", args=["true"], fixed_rate="1s")
        self.assertIsNone(system.func)
        self.assertIn("'os.system' is not schedulable", system.error)
        self.assertIn("'reports.digest'", system.error)  # what may be named instead
        flush = self.definition(name="wipe", command="flush", fixed_rate="1s")
        self.assertIsNone(flush.func)
        self.assertIn("'flush' is not in SCHEDULING['COMMANDS']", flush.error)

    def test_a_trigger_or_arguments_that_do_not_fit_are_the_error(self):
        cron = self.definition(name="a", task="reports.digest", cron="61 * * * * *")
        self.assertEqual(cron.error_field, "trigger")
        self.assertIn("61", cron.error)
        kwargs = self.definition(
            name="b", task="reports.digest", fixed_rate="1h", kwargs={"fully": True}
        )
        self.assertEqual(kwargs.error_field, "function")
        self.assertIn("fully", kwargs.error)
        command = self.definition(name="c", command="scheduling_report", fixed_rate="1h")
        self.assertIn("scheduling_report", command.error)  # its label is required
        none = self.definition(name="d", task="reports.digest")
        self.assertEqual(none.error_field, "trigger")

    def test_what_would_fail_at_every_firing_is_the_error(self):
        # The default LOCK_AT_MOST_FOR is 10 minutes: a lock held at least an hour cannot be.
        least = self.definition(
            name="a", task="reports.digest", fixed_rate="1h", lock_at_least_for="1h"
        )
        self.assertEqual(least.error_field, "lock")
        self.assertIn("lock_at_least_for", least.error)
        spaced = self.definition(name="report ", task="reports.digest", fixed_rate="1h")
        self.assertIn("whitespace", spaced.error)

    def test_a_row_that_moves_a_code_task_gives_a_trigger_only(self):
        for field, value in (("jitter", "5s"), ("args", [1]), ("missed", "skip")):
            with self.subTest(field=field):
                moved = self.definition(
                    name="nightly", override=True, fixed_rate="15m", **{field: value}
                )
                self.assertIn(f"clear {field}", moved.error)

    def test_one_target_and_a_name_of_its_own(self):
        both = self.definition(
            name="a", task="reports.digest", command="scheduling_report", fixed_rate="1h"
        )
        self.assertIn("both a task and a command", both.error)
        neither = self.definition(name="b", fixed_rate="1h")
        self.assertIn("neither a task nor a command", neither.error)
        taken = self.definition(name="nightly", task="reports.digest", fixed_rate="1h")
        self.assertIn("a task of the code is named 'nightly'", taken.error)

    def test_an_override_moves_a_code_tasks_trigger_and_keeps_its_other_options(self):
        code = code_tasks().get("nightly")
        moved = self.definition(name="nightly", override=True, fixed_rate="15m")
        self.assertIsNone(moved.error)
        self.assertEqual(moved.trigger_options, {"fixed_rate": "15m"})
        self.assertEqual(moved.options, code.options)  # lock time, retries: the code's
        self.assertIs(moved.func, code.func)
        unknown = self.definition(name="weekly", override=True, fixed_rate="15m")
        self.assertIn("no task 'weekly' in the code", unknown.error)
        with_target = self.definition(
            name="nightly", override=True, task="reports.digest", fixed_rate="15m"
        )
        self.assertIn("names no task or command", with_target.error)
        wrong = self.definition(name="nightly", override=True, cron="every day")
        self.assertEqual(wrong.error_field, "trigger")


@override_settings(SCHEDULING={"COMMANDS": COMMANDS})
class FormValidationTests(TestCase):
    """``full_clean()`` refuses what could not run, on the field it belongs to."""

    def refused(self, **fields) -> dict[str, list[str]]:
        with self.assertRaises(ValidationError) as caught:
            Schedule(**fields).full_clean()
        return caught.exception.message_dict

    def test_a_row_that_can_run_is_valid(self):
        Schedule(name="r", task="record", args=["r"], fixed_rate="5m").full_clean()
        Schedule(name="c", command="scheduling_report", args=["x"], cron="0 0 4 * * *").full_clean()

    def test_each_mistake_is_on_its_field(self):
        self.assertIn("task", self.refused(name="a", task="os.system", fixed_rate="1m"))
        self.assertIn("command", self.refused(name="b", command="flush", fixed_rate="1m"))
        self.assertIn("cron", self.refused(name="c", task="record", args=["c"], cron="nope"))
        self.assertIn("args", self.refused(name="d", task="record", fixed_rate="1m"))
        self.assertIn(
            "kwargs", self.refused(name="e", task="record", kwargs={"x": 1}, fixed_rate="1m")
        )
        self.assertIn("args", self.refused(name="f", task="record", args={"a": 1}, fixed_rate="1m"))
        both = self.refused(name="g", task="record", command="scheduling_report", fixed_rate="1m")
        self.assertIn("__all__", both)

    def test_a_duration_or_a_zone_is_wrong_on_its_own_field(self):
        base = {"task": "record", "args": ["x"], "cron": "0 0 4 * * *"}
        cases = {
            "jitter": "soon",
            "lock_at_most_for": "0s",
            "lock_at_least_for": "-1m",
            "zone": "Mars/Olympus",
        }
        for field, value in cases.items():
            with self.subTest(field=field):
                errors = self.refused(name=field, **base, **{field: value})
                self.assertEqual(list(errors), [field])
                self.assertIn(repr(value), errors[field][0])
        errors = self.refused(name="rate", task="record", args=["x"], fixed_rate="often")
        self.assertEqual(list(errors), ["fixed_rate"])

    def test_a_name_is_unique(self):
        Schedule.objects.create(name="same", task="record", args=["x"], fixed_rate="1m")
        self.assertIn("name", self.refused(name="same", task="record", args=["x"], fixed_rate="1m"))


class SettingsTests(SimpleTestCase):
    def test_commands_must_be_a_list_of_names(self):
        with self.assertRaises(InvalidSettings) as caught:
            SchedulingSettings.from_dict({"COMMANDS": "clearsessions"})
        self.assertIn("SCHEDULING['COMMANDS'] must be a list", caught.exception.problems[0])
        conf = SchedulingSettings.from_dict({"COMMANDS": ["clearsessions"]})
        self.assertEqual(conf.commands, ("clearsessions",))
        self.assertEqual(conf.schedules_poll_interval, timedelta(seconds=5))

    def test_a_command_that_does_not_exist_is_a_check_error(self):
        conf = SchedulingSettings.from_dict({"COMMANDS": ["clearsession", "scheduling_report"]})
        errors = [(e.id, e.msg, e.hint) for e in settings_errors(conf)]
        self.assertEqual(len(errors), 1, errors)
        self.assertEqual(errors[0][0], "django_scheduling.E015")
        self.assertIn("'clearsession'", errors[0][1])
        self.assertIn("did you mean 'clearsessions'?", errors[0][2])

    def test_schedulable_mistakes_are_check_errors(self):
        tasks = TaskRegistry()
        tasks.allow(send_digest, "reports.digest")
        tasks.allow(nightly, "reports.digest")
        tasks.allow(nightly, "")
        tasks.allow("not a function")
        errors = [(e.id, e.msg) for e in task_errors(tasks)]
        self.assertEqual({id for id, _ in errors}, {"django_scheduling.E014"})
        self.assertEqual(len(errors), 3, errors)
        self.assertIn("two @schedulable targets are named 'reports.digest'", errors[0][1])

    def test_a_schedulable_name_that_is_a_tasks_name_is_a_check_error(self):
        tasks = code_tasks()
        tasks.allow(send_digest, "nightly")
        errors = [(e.id, e.msg) for e in task_errors(tasks)]
        self.assertEqual(len(errors), 1, errors)
        self.assertEqual(errors[0][0], "django_scheduling.E014")
        self.assertIn("@schedulable(name='nightly') is also the name of the task", errors[0][1])

    def test_the_decorator_returns_the_function_and_names_it_by_its_path(self):
        def local():
            pass

        self.assertIs(schedulable(local), local)
        self.assertIs(registry.schedulable()[f"{__name__}.{local.__qualname__}"], local)
        self.assertIs(registry.schedulable()["record"], record_stored)


class ReplaceAndRemoveTests(SimpleTestCase):
    """The scheduler's entries, replaced and removed while it runs (no database)."""

    def make(self):
        runner = MemoryRunner()
        from django_scheduling.runtime.scheduler import Scheduler

        scheduler = Scheduler(runner)
        self.addCleanup(scheduler.shutdown, 5)
        return scheduler

    def entry(self, name, period, action=None, *, first=None):
        """An entry every *period*, first at *first* (by default at once)."""
        state = TriggerState(anchor=first)
        return Entry(name, Task(FixedRateTrigger(period), action=action, state=state))

    def test_a_replaced_entry_fires_on_its_new_schedule_only(self):
        scheduler = self.make()
        old = self.entry("job", timedelta(milliseconds=50))
        scheduler.add(old)
        scheduler.start()
        wait_for(lambda: len(old.payload.runs) >= 2)
        new = self.entry("job", timedelta(milliseconds=50))
        scheduler.replace(new)
        wait_for(lambda: not old.running)
        count = len(old.payload.runs)
        wait_for(lambda: len(new.payload.runs) >= 3)
        self.assertEqual(len(old.payload.runs), count)
        self.assertIsNone(old.next_fire_time)
        self.assertIs(scheduler.entry("job"), new)

    def test_a_removed_entry_fires_no_more(self):
        scheduler = self.make()
        entry = self.entry("job", timedelta(milliseconds=50))
        scheduler.add(entry)
        scheduler.start()
        wait_for(lambda: len(entry.payload.runs) >= 2)
        self.assertTrue(scheduler.remove("job"))
        wait_for(lambda: not entry.running)
        count = len(entry.payload.runs)
        # Another entry, fired after the removal, shows the dispatcher went on meanwhile.
        witness = self.entry("witness", timedelta(milliseconds=50))
        scheduler.add(witness)
        wait_for(lambda: len(witness.payload.runs) >= 3)
        self.assertEqual(len(entry.payload.runs), count)
        self.assertIsNone(scheduler.entry("job"))
        self.assertFalse(scheduler.remove("job"))

    def blocking(self, name="job"):
        """An entry every 20 ms whose runs wait for the returned event, and the peak number
        of its runs and its successors' at once (a list, filled as they run)."""
        release, at_once, peak = threading.Event(), [0], [0]
        lock = threading.Lock()

        def action():
            with lock:
                at_once[0] += 1
                peak[0] = max(peak[0], at_once[0])
            release.wait(10)
            with lock:
                at_once[0] -= 1

        return self.entry(name, timedelta(milliseconds=20), action=action), release, peak

    def test_an_entry_removed_while_it_runs_then_added_again_waits_for_the_run(self):
        scheduler = self.make()
        old, release, peak = self.blocking()
        scheduler.add(old)
        scheduler.start()
        wait_for(lambda: old.running)
        self.assertTrue(scheduler.remove("job"))  # disabled while it runs...
        again = Entry("job", replace(old.payload, runs=[]))
        scheduler.replace(again)  # ...and enabled again before the run ends
        newer = Entry("job", replace(old.payload, runs=[]))
        scheduler.replace(newer)  # and changed once more
        self.assertTrue(newer.running)
        release.set()
        wait_for(lambda: len(newer.payload.runs) >= 3)
        self.assertEqual(peak, [1])
        self.assertEqual(again.payload.runs, [])  # replaced before it ever ran
        self.assertGreaterEqual(newer.payload.runs[0][1], old.payload.runs[0][2])

    def test_an_entry_replaced_while_it_runs_waits_for_the_runs_end(self):
        scheduler = self.make()
        release = threading.Event()
        old = self.entry("job", timedelta(milliseconds=20), action=lambda: release.wait(10))
        scheduler.add(old)
        scheduler.start()
        wait_for(lambda: old.running)
        started = now()
        new = self.entry("job", timedelta(milliseconds=20))
        scheduler.replace(new)
        scheduler.run_now("job", RunRequest())  # asked for while the old run goes on
        self.assertTrue(new.running)
        self.assertEqual(new.payload.runs, [])
        release.set()
        wait_for(lambda: len(new.payload.runs) >= 3)
        (old_run,) = old.payload.runs
        # Never at once: the new entry's first run starts after the old one's end.
        self.assertGreaterEqual(new.payload.runs[0][1], old_run[2])
        self.assertGreater(old_run[2], started)
        # The run asked for went to the new entry.
        self.assertIn(None, [fire_time for fire_time, _, _ in new.payload.runs])


class RunningSchedulerTests(TransactionTestCase):
    """A scheduler service applies what changed in the table when it reads it; here the
    test reads for it (``refresh``), and the maintenance thread's own reads are an hour
    apart."""

    def setUp(self):
        self.tasks = TaskRegistry()
        self.ran = threading.Event()
        self.tasks.allow(self.ran.set, "ran")
        self.tasks.allow(record_stored, "record")
        self.tasks.add(nightly, cron="0 0 3 * * *", name="nightly")
        conf = dataclasses.replace(get_settings(), schedules_poll_interval=timedelta(hours=1))
        Schedule.objects.create(name="db.first", task="ran", fixed_rate="1h")
        self.service = SchedulerService(tasks=self.tasks, conf=conf)
        self.service.start()
        self.addCleanup(self.service.stop, 5)

    def refresh(self) -> bool:
        service = self.service
        return service.schedules.refresh(service.scheduler, service.pipeline, now=timezone.now())

    def spec(self, name):
        return self.service.scheduler.entry(name)

    def test_the_rows_at_start_are_tasks_like_the_codes(self):
        self.assertEqual({spec.name for spec in self.service.specs}, {"db.first", "nightly"})
        self.assertEqual(ScheduledTask.objects.get(name="db.first").trigger, "every 1h")

    def test_a_created_schedule_runs_and_a_changed_one_starts_afresh(self):
        Schedule.objects.create(name="db.new", task="ran", fixed_rate="100ms")
        self.assertTrue(self.refresh())
        poll(lambda: TaskRun.objects.filter(task_name="db.new").exists(), timeout=10)
        before = self.spec("db.new")
        Schedule.objects.filter(name="db.new").update(fixed_rate="", cron="0 0 4 * * *")
        self.assertTrue(self.refresh())
        row = ScheduledTask.objects.get(name="db.new")
        self.assertEqual(row.kind, "cron")
        self.assertIsNone(row.last_fire_time)  # afresh: no fire time of the old trigger
        self.assertIsNot(self.spec("db.new"), before)
        # Its row shows the new trigger's next fire time, also while it waits for a run.
        self.assertEqual(ScheduledTask.objects.get(name="db.new").next_fire_time.hour, 4)
        # Scheduled once a run of the old trigger under way has ended.
        poll(lambda: self.spec("db.new").next_fire_time is not None, timeout=10)
        self.assertEqual(self.spec("db.new").next_fire_time.hour, 4)

    def test_a_disabled_or_deleted_schedule_stops_and_its_row_is_marked_removed(self):
        Schedule.objects.filter(name="db.first").update(enabled=False)
        self.assertTrue(self.refresh())
        self.assertIsNone(self.spec("db.first"))
        self.assertIsNotNone(ScheduledTask.objects.get(name="db.first").removed_at)
        Schedule.objects.filter(name="db.first").update(enabled=True)
        self.assertTrue(self.refresh())
        self.assertIsNotNone(self.spec("db.first"))
        self.assertIsNone(ScheduledTask.objects.get(name="db.first").removed_at)
        Schedule.objects.filter(name="db.first").delete()
        self.assertTrue(self.refresh())
        self.assertIsNone(self.spec("db.first"))
        self.assertIsNotNone(ScheduledTask.objects.get(name="db.first").removed_at)

    def test_a_schedule_enabled_again_starts_afresh_without_a_backlog(self):
        # Its first fire time, at start, is over: no firing of it is under way (one deciding
        # now would read the row edited below).
        self.assertTrue(self.ran.wait(10))
        poll(lambda: not self.spec("db.first").running, timeout=10)
        began = timezone.now()
        Schedule.objects.filter(name="db.first").update(enabled=False, missed="run_all")
        self.assertTrue(self.refresh())
        # Disabled for a day: 24 hourly fire times passed meanwhile, all before the test.
        long_ago = began - timedelta(days=1, minutes=30)
        ScheduledTask.objects.filter(name="db.first").update(
            anchor=long_ago, last_fire_time=long_ago
        )
        enabled_at = timezone.now()
        Schedule.objects.filter(name="db.first").update(enabled=True)
        self.assertTrue(self.refresh())
        row = ScheduledTask.objects.get(name="db.first")
        self.assertIsNone(row.removed_at)
        # Afresh: anchored now. (It may have fired at once since, as a new schedule does.)
        self.assertGreaterEqual(row.anchor, enabled_at)
        self.assertTrue(row.last_fire_time is None or row.last_fire_time >= enabled_at)
        fired = self.spec("db.first").state.last_fire_time
        self.assertTrue(fired is None or fired >= enabled_at, fired)
        # The missed fire times are long_ago + 1h, + 2h, ...: all half an hour or more before
        # the test (whose start-up ran the schedule once, seconds before it began).
        missed = TaskRun.objects.filter(
            task_name="db.first", scheduled_at__lt=began - timedelta(minutes=10)
        )
        self.assertFalse(missed.exists(), "a fire time missed while it was disabled ran")

    def test_an_override_moves_a_code_task_and_its_removal_moves_it_back(self):
        code = self.spec("nightly")
        Schedule.objects.create(name="nightly", override=True, fixed_rate="1h")
        self.assertTrue(self.refresh())
        self.assertEqual(self.spec("nightly").trigger.describe(), "every 1h")
        self.assertEqual(ScheduledTask.objects.get(name="nightly").trigger, "every 1h")
        Schedule.objects.filter(name="nightly").delete()
        self.assertTrue(self.refresh())
        self.assertEqual(self.spec("nightly").trigger, code.trigger)
        self.assertIsNone(ScheduledTask.objects.get(name="nightly").removed_at)

    def test_a_row_that_names_anything_else_never_runs_and_says_why(self):
        Schedule.objects.create(name="evil", task="os.system", args=["true"], fixed_rate="1s")
        Schedule.objects.create(name="wipe", command="flush", fixed_rate="1s")
        self.assertTrue(self.refresh())
        self.assertIsNone(self.spec("evil"))
        self.assertIsNone(self.spec("wipe"))
        self.assertIn("not schedulable", Schedule.objects.get(name="evil").error)
        self.assertIn("SCHEDULING['COMMANDS']", Schedule.objects.get(name="wipe").error)
        self.assertFalse(ScheduledTask.objects.filter(name__in=["evil", "wipe"]).exists())
        # Writing the errors is no change: the next read finds nothing to do.
        self.assertFalse(self.refresh())
        # Fixed, the row runs, and its error is cleared.
        Schedule.objects.filter(name="evil").update(task="ran", args=[])
        self.assertTrue(self.refresh())
        self.assertIsNotNone(self.spec("evil"))
        self.assertEqual(Schedule.objects.get(name="evil").error, "")

    def test_a_database_schedule_runs_now_when_asked_in_the_admin(self):
        self.assertTrue(self.ran.wait(10))  # its first fire time, at start
        self.ran.clear()
        ScheduledTask.objects.filter(name="db.first").update(run_requested_at=timezone.now())
        self.assertTrue(self.ran.wait(10))
        poll(
            lambda: TaskRun.objects.filter(task_name="db.first", scheduled_at=None).exists(),
            timeout=10,
        )

    def test_every_change_is_seen_whatever_the_clocks_and_the_fields_saved(self):
        schedule = Schedule.objects.get(name="db.first")
        schedule.fixed_rate = "2h"
        schedule.save(update_fields=["fixed_rate"])
        self.assertTrue(self.refresh())
        self.assertEqual(self.spec("db.first").trigger.describe(), "every 2h")
        # Stamped by a clock an hour behind that of the newest change (another row's).
        Schedule.objects.create(name="db.newest", task="ran", fixed_rate="1h", enabled=False)
        self.assertTrue(self.refresh())
        an_hour_ago = timezone.now() - timedelta(hours=1)
        Schedule.objects.filter(name="db.first").update(fixed_rate="3h", updated_at=an_hour_ago)
        self.assertTrue(self.refresh())
        self.assertEqual(self.spec("db.first").trigger.describe(), "every 3h")
        # Two saves of one row, each from a copy read before either: both count.
        first, second = Schedule.objects.get(name="db.first"), Schedule.objects.get(name="db.first")
        first.fixed_rate = "4h"
        first.save()
        self.assertTrue(self.refresh())
        second.fixed_rate = "5h"
        second.save()
        self.assertEqual(second.revision, first.revision + 1)
        self.assertTrue(self.refresh())
        self.assertEqual(self.spec("db.first").trigger.describe(), "every 5h")

    def test_nothing_changed_costs_one_query(self):
        with CaptureQueriesContext(connection) as queries:
            self.assertFalse(self.refresh())
        self.assertEqual(len(queries), 1, [q["sql"] for q in queries])


class ListTests(TestCase):
    """``runscheduler --list`` shows the tasks as the scheduler will run them."""

    def listed(self, *args: str) -> dict[str, str]:
        tasks = code_tasks()
        tasks.allow(record_stored, "record")
        out = io.StringIO()
        with mock.patch("django_scheduling.management.commands.runscheduler.registry", tasks):
            call_command("runscheduler", "--list", *args, stdout=out)
        self.output = out.getvalue()
        lines = [line.split("  ") for line in out.getvalue().splitlines()]
        return {name: trigger for name, trigger, *_ in lines}

    def test_the_schedules_in_the_database_and_the_moved_code_tasks(self):
        Schedule.objects.create(name="db.one", task="record", args=["x"], fixed_rate="1h")
        Schedule.objects.create(
            name="db.off", task="record", args=["x"], fixed_rate="1h", enabled=False
        )
        Schedule.objects.create(name="nightly", override=True, fixed_rate="15m")
        self.assertEqual(self.listed(), {"db.one": "every 1h", "nightly": "every 15m"})
        # An instance that runs chosen tasks runs no database schedule.
        self.assertEqual(self.listed("--task", "nightly"), {"nightly": "every 15m"})
        self.assertIn("nightly  every 15m", self.output)
        self.assertIn("(moved from the code's schedule in the admin)", self.output)

    def test_the_timeline_plans_them_with_their_triggers(self):
        from django_scheduling.admin.mixins import read_plans

        Schedule.objects.create(name="db.one", task="record", args=["x"], fixed_rate="1h")
        Schedule.objects.create(name="nightly", override=True, fixed_rate="15m")
        for name, trigger in (("db.one", "every 1h"), ("nightly", "every 15m")):
            ScheduledTask.objects.create(name=name, kind="fixed_rate", trigger=trigger)
        tasks = code_tasks()
        tasks.allow(record_stored, "record")
        with mock.patch("django_scheduling.tasks.registry.registry", tasks):
            plans, _ = read_plans(conf=get_settings(), default_zone=timezone.get_default_timezone())
        triggers = {plan.name: plan.trigger and plan.trigger.describe() for plan in plans}
        self.assertEqual(triggers, {"db.one": "every 1h", "nightly": "every 15m"})
