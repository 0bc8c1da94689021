"""@scheduled, the registry, the SCHEDULING setting and the system checks."""

import asyncio
import functools
import os
import select
import signal
from collections.abc import Mapping
from datetime import timedelta

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import SimpleTestCase, override_settings

from django_scheduling import checks as scheduling_checks
from django_scheduling import scheduled
from django_scheduling.conf import InvalidSettings, SchedulingSettings, get_settings
from django_scheduling.locking import get_lock_provider
from django_scheduling.tasks import registry as registry_module
from django_scheduling.tasks.registry import TaskRegistry


def job():
    return "ran"


async def async_job():
    await asyncio.sleep(0)


class ScheduledDecoratorTests(SimpleTestCase):
    # ``manage.py check`` runs the model checks, which ask SQLite whether it has JSON once.
    databases = {"default"}

    def setUp(self):
        self.saved = registry_module.registry
        registry_module.registry = TaskRegistry()
        scheduling_checks.registry = registry_module.registry
        self.addCleanup(self.restore)

    def restore(self):
        registry_module.registry = self.saved
        scheduling_checks.registry = self.saved

    def fresh(self):
        """Start again from an empty registry, within one test (for its subtests)."""
        registry_module.registry = TaskRegistry()
        scheduling_checks.registry = registry_module.registry

    def test_returns_the_function_unchanged(self):
        decorated = scheduled(fixed_rate="5s")(job)
        self.assertIs(decorated, job)
        self.assertEqual(decorated(), "ran")

    def test_default_name_is_module_and_qualname(self):
        scheduled(fixed_rate="5s")(job)
        self.assertIn(f"{__name__}.job", registry_module.registry)

    def test_async_functions_are_recognised(self):
        scheduled(fixed_rate="5s", name="async")(async_job)
        self.assertTrue(registry_module.registry.get("async").is_async)

    def test_options_are_kept(self):
        scheduled(fixed_rate="5s", lock_at_most_for="1m", lock_at_least_for="2s", name="x")(job)
        definition = registry_module.registry.get("x")
        self.assertEqual(definition.lock_at_most_for, timedelta(minutes=1))
        self.assertEqual(definition.lock_at_least_for, timedelta(seconds=2))
        self.assertIsNone(definition.error)

    def check_messages(self):
        return scheduling_checks.check_tasks()

    def assert_one_error(self, check_id, text):
        messages = self.check_messages()
        self.assertEqual([m.id for m in messages], [check_id], messages)
        self.assertIn(text, messages[0].msg)
        self.assertIsInstance(messages[0], checks.Error)

    def test_invalid_cron_is_reported_by_check(self):
        scheduled(cron="0 0 25 * * *", name="bad")(job)
        self.assert_one_error("django_scheduling.E001", "hour value 25 is out of range 0-23")

    def test_invalid_duration_is_reported(self):
        scheduled(fixed_rate="often", name="bad")(job)
        self.assert_one_error("django_scheduling.E001", "invalid fixed_rate 'often'")

    def test_unknown_zone_is_reported(self):
        scheduled(cron="@daily", zone="Europe/Atlantis", name="bad")(job)
        self.assert_one_error("django_scheduling.E001", "unknown time zone 'Europe/Atlantis'")

    def test_cron_with_initial_delay_is_reported(self):
        scheduled(cron="@daily", initial_delay="5s", name="bad")(job)
        self.assert_one_error("django_scheduling.E001", "initial_delay= applies to fixed_rate=")

    def test_two_trigger_kinds_are_reported(self):
        scheduled(cron="@daily", fixed_delay="5s", name="bad")(job)
        self.assert_one_error("django_scheduling.E001", "give exactly one of")

    def test_lock_times_that_make_no_sense_are_reported(self):
        scheduled(fixed_rate="5s", lock_at_most_for="1s", lock_at_least_for="5s", name="a")(job)
        self.assert_one_error(
            "django_scheduling.E003",
            "Task 'a' (tests.test_registry_and_checks.job): lock_at_least_for ('5s') exceeds "
            "lock_at_most_for ('1s'); lower lock_at_least_for",
        )
        self.assertEqual(self.check_messages()[0].msg.count("'a'"), 1)

    def test_zero_lock_at_most_for_is_reported(self):
        scheduled(fixed_rate="5s", lock_at_most_for=0, name="a")(job)
        self.assert_one_error("django_scheduling.E003", "lock_at_most_for must be positive, got 0")

    def test_negative_durations_are_reported_as_such(self):
        scheduled(fixed_delay="-3s", name="a")(job)
        self.assert_one_error("django_scheduling.E001", "fixed_delay must be positive, got '-3s'")

    def test_lock_times_without_lock_are_reported(self):
        scheduled(fixed_rate="5s", lock=False, lock_at_most_for="1m", name="a")(job)
        self.assert_one_error("django_scheduling.E003", "need lock=True")

    def test_recover_without_lock_is_reported(self):
        scheduled(fixed_rate="5s", lock=False, recover=True, name="a")(job)
        self.assert_one_error("django_scheduling.E003", "recover=True needs lock=True")

    def test_recover_must_be_a_boolean(self):
        scheduled(fixed_rate="5s", recover="yes", name="a")(job)
        self.assert_one_error("django_scheduling.E003", "recover='yes' must be True or False")

    def test_duplicate_names_are_reported(self):
        scheduled(fixed_rate="5s", name="same")(job)
        scheduled(fixed_rate="5s", name="same")(async_job)
        self.assert_one_error("django_scheduling.E002", "Two tasks are named 'same'")

    def test_registering_the_same_function_again_is_not_a_duplicate(self):
        scheduled(fixed_rate="5s")(job)
        scheduled(fixed_rate="5s")(job)
        self.assertEqual(self.check_messages(), [])

    def test_functions_that_need_arguments_are_reported(self):
        class Reports:
            @scheduled(fixed_rate="5s", name="method")
            def send(self):
                pass

        def with_parameter(day):
            pass

        def with_keyword(*, day):
            pass

        scheduled(fixed_rate="5s", name="parameter")(with_parameter)
        scheduled(fixed_rate="5s", name="keyword")(with_keyword)
        messages = {m.msg.partition(" ")[2].partition(" ")[0]: m for m in self.check_messages()}
        self.assertEqual(
            {name: m.id for name, m in messages.items()},
            dict.fromkeys(["'keyword'", "'method'", "'parameter'"], "django_scheduling.E009"),
        )
        self.assertIn(
            "the function needs the argument(s) self, but a task is called with none",
            messages["'method'"].msg,
        )
        self.assertIn("a module-level function", messages["'method'"].hint)
        self.assertIn("needs the argument(s) day", messages["'parameter'"].msg)
        self.assertIn("needs the argument(s) day", messages["'keyword'"].msg)

    def test_functions_whose_arguments_are_optional_pass(self):
        def defaults(day=None, *args, retries=3, **kwargs):
            pass

        scheduled(fixed_rate="5s", name="defaults")(defaults)
        self.assertEqual(self.check_messages(), [])

    def test_wrapped_functions_are_read_through_their_wrapper(self):
        def needs_day(day):
            pass

        @functools.wraps(needs_day)
        def wrapper(*args, **kwargs):
            return needs_day(*args, **kwargs)

        def positional_only(first, /, second=2, *, third, fourth=4):
            pass

        scheduled(fixed_rate="5s", name="wrapped")(wrapper)
        scheduled(fixed_rate="5s", name="positional")(positional_only)
        messages = {m.msg.partition(" ")[2].partition(" ")[0]: m.msg for m in self.check_messages()}
        self.assertIn("needs the argument(s) day,", messages["'wrapped'"])
        self.assertIn("needs the argument(s) first, third,", messages["'positional'"])

    # -- misuse never raises: each mistake is a check error naming the task and the fix ------

    def test_an_unknown_keyword_names_the_option_it_most_looks_like(self):
        for given, meant in (
            ("timezone", "zone"),
            ("tz", "zone"),
            ("every", "fixed_rate"),
            ("max_retries", "retries"),
            ("lock_at_most", "lock_at_most_for"),
            ("fixed_dealy", "fixed_delay"),
        ):
            with self.subTest(keyword=given):
                self.fresh()
                decorated = scheduled(cron="@daily", name="report", **{given: "x"})(job)
                self.assertIs(decorated, job)
                self.assert_one_error(
                    "django_scheduling.E011",
                    f"Task 'report' (tests.test_registry_and_checks.job): @scheduled() got an "
                    f"unknown option {given}='x'; did you mean {meant}=?",
                )

    def test_an_unknown_keyword_like_no_option_lists_them(self):
        scheduled(cron="@daily", name="report", colour="blue")(job)
        self.assert_one_error("django_scheduling.E011", "the options are cron=, zone=,")

    def test_a_bare_decorator_is_reported_and_the_function_kept(self):
        decorated = scheduled(job)
        self.assertIs(decorated, job)
        self.assertEqual(decorated(), "ran")
        self.assert_one_error(
            "django_scheduling.E011",
            "Task 'tests.test_registry_and_checks.job': @scheduled needs its options in "
            "parentheses: write @scheduled(cron=...)",
        )

    def test_a_positional_expression_is_reported(self):
        decorated = scheduled("*/5 * * * *")(job)
        self.assertIs(decorated, job)
        self.assert_one_error(
            "django_scheduling.E011",
            "@scheduled() takes options by keyword only, got the positional argument "
            "'*/5 * * * *'; did you mean cron='*/5 * * * *'?",
        )

    def test_values_of_the_wrong_type_are_reported(self):
        cases = [
            ({"cron": 5}, "E001", "cron=5 must be a cron expression in a string"),
            ({"cron": "@daily", "zone": 1}, "E001", "zone=1 must be a time zone name"),
            ({"at": "2027-01-01"}, "E001", "at='2027-01-01' must be an aware datetime"),
            ({"fixed_rate": "5s", "missed": 1}, "E001", "missed=1 must be one of"),
            ({"fixed_rate": [5]}, "E001", "invalid fixed_rate [5] of type list"),
            ({"fixed_rate": "5s", "name": 7}, "E007", "name=7 must be a non-empty string"),
            ({"fixed_rate": "5s", "lock": "yes"}, "E003", "lock='yes' must be True or False"),
            ({"fixed_rate": "5s", "args": "x"}, "E009", "args='x' must be a tuple or a list"),
            ({"fixed_rate": "5s", "timeout": "soon"}, "E011", "invalid timeout 'soon'"),
            ({"fixed_rate": "5s", "timeout": 0}, "E011", "timeout must be positive, got 0"),
            ({"fixed_rate": "5s", "retries": -1}, "E011", "retries=-1 must be a whole number"),
            ({"fixed_rate": "5s", "retries": True}, "E011", "retries=True must be a whole"),
            ({"fixed_rate": "5s", "retry_backoff": "1s"}, "E011", "need retries=1 or more"),
            (
                {"fixed_rate": "5s", "retries": 2, "retry_backoff": "1m", "retry_backoff_max": 5},
                "E011",
                "retry_backoff_max (5) is shorter than retry_backoff ('1m')",
            ),
        ]
        for options, check_id, text in cases:
            with self.subTest(options=options):
                self.fresh()
                options = {"name": "t", **options}
                self.assertIs(scheduled(**options)(job), job)
                self.assert_one_error(f"django_scheduling.{check_id}", text)

    def test_a_misused_task_leaves_the_others_valid(self):
        scheduled(fixed_rate="5s", name="fine")(job)
        scheduled(fixed_rate="5s", name="typo", timezone="UTC")(job)
        tasks = registry_module.registry
        self.assertIsNone(tasks.get("fine").error)
        self.assertIn("did you mean zone=?", tasks.get("typo").error)

    def test_timeout_and_retries_are_kept(self):
        scheduled(fixed_rate="1m", name="t", timeout="10m", retries=2, retry_backoff="5s")(job)
        definition = registry_module.registry.get("t")
        self.assertIsNone(definition.error)
        self.assertEqual(
            (
                definition.timeout,
                definition.retries,
                definition.retry_backoff,
                definition.retry_backoff_max,
            ),
            (timedelta(minutes=10), 2, timedelta(seconds=5), timedelta(minutes=10)),
        )
        scheduled(fixed_rate="1m", name="plain")(job)
        plain = registry_module.registry.get("plain")
        self.assertEqual((plain.timeout, plain.retries), (None, 0))

    def test_the_default_backoff_cap_is_never_below_the_backoff(self):
        scheduled(fixed_rate="1d", name="t", retries=2, retry_backoff="1h")(job)
        definition = registry_module.registry.get("t")
        self.assertEqual(definition.retry_backoff_max, timedelta(hours=1))

    def test_too_long_name_is_reported(self):
        scheduled(fixed_rate="5s", name="x" * 201)(job)
        self.assert_one_error("django_scheduling.E007", "the limit is 200")

    def test_manage_py_check_fails_on_a_bad_task(self):
        scheduled(cron="0 0 25 * * *", name="bad")(job)
        with self.assertRaisesMessage(SystemCheckError, "django_scheduling.E001"):
            call_command("check")

    def test_the_scheduler_refuses_to_start_with_a_bad_task(self):
        from django_scheduling.runtime.service import SchedulerService

        scheduled(cron="0 0 25 * * *", name="bad")(job)
        with self.assertRaisesMessage(ImproperlyConfigured, "hour value 25 is out of range"):
            SchedulerService([], tasks=registry_module.registry).start()


class SettingsTests(SimpleTestCase):
    def test_defaults(self):
        conf = SchedulingSettings.from_dict({})
        self.assertTrue(conf.autostart)
        self.assertEqual(conf.task_module, "tasks")
        self.assertEqual(conf.lock_at_most_for, timedelta(minutes=10))
        self.assertEqual(conf.history_retention, timedelta(days=30))
        self.assertEqual(conf.rejection_policy, "abort")
        self.assertIsNone(conf.queue_capacity)  # unbounded: a due firing is never dropped
        self.assertEqual(conf.housekeeping_interval, timedelta(minutes=1))
        self.assertEqual(SchedulingSettings.from_dict({"QUEUE_CAPACITY": 100}).queue_capacity, 100)

    @override_settings(SCHEDULING={"SHUTDOWN_TIMEOUT": "5s"})
    def test_read_lazily_and_reset_by_override_settings(self):
        self.assertEqual(get_settings().shutdown_timeout, timedelta(seconds=5))
        with self.settings(SCHEDULING={"SHUTDOWN_TIMEOUT": "PT1M"}):
            self.assertEqual(get_settings().shutdown_timeout, timedelta(minutes=1))
        self.assertEqual(get_settings().shutdown_timeout, timedelta(seconds=5))

    @override_settings(SCHEDULING={})
    def test_a_forked_process_reads_its_own_default_instance_name(self):
        # A gunicorn worker forked from a master that read the setting (--preload) is an
        # instance of its own.
        parent = get_settings().instance_name
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            try:
                os.write(write, get_settings().instance_name.encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            # A child that hangs (a lock held by another thread at the fork) fails the test.
            ready, _, _ = select.select([pipe], [], [], 30)
            if not ready:
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self.assertTrue(ready, "the forked child did not answer within 30 s")
            child = pipe.read().decode()
        self.assertEqual(get_settings().instance_name, parent)
        self.assertNotEqual(child, parent)
        self.assertIn(str(pid), child)

    @override_settings(SCHEDULING={"SHUTDOWN_TIMEOUT": "5s"})
    def test_a_value_read_while_the_setting_changes_back_is_not_kept(self):
        """A thread that reads the setting while ``override_settings`` (or a project) changes
        it must not keep the old value after the change reset the cache."""
        changing = override_settings(SCHEDULING=None)

        class ChangesWhileRead(Mapping):
            def __init__(self) -> None:
                self.data, self.changed = {"SHUTDOWN_TIMEOUT": "PT1M"}, False

            def __getitem__(self, key: str) -> object:
                return self.data[key]

            def __len__(self) -> int:
                return len(self.data)

            def __iter__(self):
                if not self.changed:  # the change lands halfway through the read
                    self.changed = True
                    changing.disable()
                return iter(self.data)

        changing.options["SCHEDULING"] = ChangesWhileRead()
        changing.enable()
        self.assertEqual(get_settings().shutdown_timeout, timedelta(minutes=1))  # as read
        self.assertEqual(get_settings().shutdown_timeout, timedelta(seconds=5))  # read again

    def test_rejections_name_the_key_and_the_fix(self):
        cases = [
            ({"POOL": 3}, "SCHEDULING has an unknown key 'POOL'; the keys are AUTOSTART, "),
            ({"core_pool_size": 3}, "unknown key 'core_pool_size'; did you mean 'CORE_POOL_SIZE'?"),
            ({"CORE_POOL_SIZE": -1}, "SCHEDULING['CORE_POOL_SIZE'] must be a whole number"),
            ({"MAX_POOL_SIZE": "8"}, "SCHEDULING['MAX_POOL_SIZE'] must be a whole number"),
            (
                {"QUEUE_CAPACITY": -1},
                "SCHEDULING['QUEUE_CAPACITY'] must be a whole number of at least 0, got -1, or "
                "None for no bound",
            ),
            ({"HOUSEKEEPING_INTERVAL": 0}, "SCHEDULING['HOUSEKEEPING_INTERVAL'] must be positive"),
            (
                {"CORE_POOL_SIZE": 8, "MAX_POOL_SIZE": 2},
                "SCHEDULING['MAX_POOL_SIZE'] (2) is smaller than SCHEDULING['CORE_POOL_SIZE'] (8)",
            ),
            ({"REJECTION_POLICY": "drop"}, "SCHEDULING['REJECTION_POLICY'] is 'drop'; use one of"),
            ({"KEEP_ALIVE": "1 minute"}, "invalid SCHEDULING['KEEP_ALIVE'] '1 minute'"),
            ({"LOCK_AT_MOST_FOR": 0}, "SCHEDULING['LOCK_AT_MOST_FOR'] must be positive, got 0"),
            (
                {"LOCK_AT_MOST_FOR": "1s", "LOCK_AT_LEAST_FOR": "2s"},
                "SCHEDULING['LOCK_AT_LEAST_FOR'] ('2s') exceeds",
            ),
            ({"AUTOSTART": "yes"}, "SCHEDULING['AUTOSTART'] must be True or False"),
            ({"LOCK_PROVIDER": ""}, "SCHEDULING['LOCK_PROVIDER'] must be a non-empty string"),
            ({"INSTANCE_NAME": ""}, "SCHEDULING['INSTANCE_NAME'] must be a non-empty string"),
        ]
        for raw, message in cases:
            with self.subTest(raw=raw), self.assertRaisesMessage(ImproperlyConfigured, message):
                SchedulingSettings.from_dict(raw)

    def test_a_lock_provider_is_chosen_by_name_or_dotted_path(self):
        for setting, expected in (
            ("database", "DatabaseLockProvider"),
            ("memory", "InMemoryLockProvider"),
            ("django_scheduling.locking.memory.InMemoryLockProvider", "InMemoryLockProvider"),
        ):
            with self.subTest(setting), self.settings(SCHEDULING={"LOCK_PROVIDER": setting}):
                self.assertEqual(type(get_lock_provider()).__name__, expected)
                self.assertEqual(scheduling_checks.settings_errors(), [])
        for setting, problem in (
            ("redis", "redis doesn't look like a module path"),
            ("myproject.locks.RedisLockProvider", "No module named 'myproject'"),
            ("django_scheduling.conf.SchedulingSettings", "is not a subclass of BaseLockProvider"),
        ):
            with self.subTest(setting), self.settings(SCHEDULING={"LOCK_PROVIDER": setting}):
                [error] = scheduling_checks.settings_errors()
                self.assertEqual(error.id, "django_scheduling.E004")
                self.assertIn(f"SCHEDULING['LOCK_PROVIDER'] is {setting!r}", error.msg)
                self.assertIn(problem, error.msg)

    def test_every_problem_is_named_at_once(self):
        raw = {"CORE_POOL_SIZ": 8, "LOCK_AT_MOST_FOR": "ten minutes", "AUTOSTART": "yes"}
        with self.assertRaises(InvalidSettings) as caught:
            SchedulingSettings.from_dict(raw)
        self.assertEqual(len(caught.exception.problems), 3, caught.exception.problems)
        with self.settings(SCHEDULING=raw):
            messages = scheduling_checks.check_settings()
        self.assertEqual([m.id for m in messages], ["django_scheduling.E004"] * 3)
        text = "\n".join(m.msg for m in messages)
        for part in (
            "unknown key 'CORE_POOL_SIZ'; did you mean 'CORE_POOL_SIZE'?",
            "invalid SCHEDULING['LOCK_AT_MOST_FOR'] 'ten minutes'",
            "SCHEDULING['AUTOSTART'] must be True or False, got 'yes'",
        ):
            self.assertIn(part, text)

    def test_a_setting_that_is_not_a_dict_is_a_check_error(self):
        for value in ("yes", ["CORE_POOL_SIZE", 8], 1):
            with self.subTest(value=value), self.settings(SCHEDULING=value):
                messages = scheduling_checks.check_settings()
                self.assertEqual([m.id for m in messages], ["django_scheduling.E004"])
                self.assertIn(f"SCHEDULING must be a dict, got {value!r}", messages[0].msg)

    def test_cross_checks_wait_for_valid_values(self):
        with self.assertRaises(InvalidSettings) as caught:
            SchedulingSettings.from_dict({"MAX_POOL_SIZE": "8", "LOCK_AT_LEAST_FOR": "soon"})
        self.assertEqual(len(caught.exception.problems), 2, caught.exception.problems)

    @override_settings(SCHEDULING={"CORE_POOL_SIZE": "four"})
    def test_bad_setting_is_a_check_error(self):
        messages = scheduling_checks.check_settings()
        self.assertEqual([m.id for m in messages], ["django_scheduling.E004"])
        self.assertIn("CORE_POOL_SIZE", messages[0].msg)

    @override_settings(USE_TZ=False)
    def test_use_tz_false_is_a_check_error(self):
        messages = scheduling_checks.check_settings()
        self.assertEqual([m.id for m in messages], ["django_scheduling.E006"])

    @override_settings(SCHEDULING={"DATABASE": "elsewhere"})
    def test_unknown_database_alias_is_a_check_error(self):
        messages = scheduling_checks.check_settings()
        self.assertEqual([m.id for m in messages], ["django_scheduling.E005"])
        self.assertIn("'elsewhere', which is not in DATABASES", messages[0].msg)

    def test_unsupported_database_is_a_check_error_and_stops_the_scheduler(self):
        from unittest import mock

        from django.db import connections

        from django_scheduling.runtime.service import SchedulerService

        with mock.patch.object(connections["default"], "vendor", "oracle"):
            messages = scheduling_checks.check_settings()
            self.assertEqual([m.id for m in messages], ["django_scheduling.E008"])
            self.assertIn("is oracle, which django_scheduling does not support", messages[0].msg)
            with self.assertRaisesMessage(
                ImproperlyConfigured,
                "(django_scheduling.E008) The database 'default' is oracle",
            ):
                SchedulerService([], tasks=TaskRegistry()).check()

    def test_a_database_in_local_time_is_a_check_error_and_stops_the_scheduler(self):
        from unittest import mock

        from django.db import connections

        from django_scheduling.runtime.service import SchedulerService

        conn = connections["default"]
        for zone in (None, "UTC"):
            with mock.patch.dict(conn.settings_dict, {"TIME_ZONE": zone}):
                self.assertEqual(scheduling_checks.check_settings(), [])
        # A database that converts time zones itself (PostgreSQL) keeps UTC whatever it says.
        with (
            mock.patch.dict(conn.settings_dict, {"TIME_ZONE": "Europe/Paris"}),
            mock.patch.object(conn.features, "supports_timezones", True),
        ):
            self.assertEqual(scheduling_checks.check_settings(), [])
        with (
            mock.patch.dict(conn.settings_dict, {"TIME_ZONE": "Europe/Paris"}),
            mock.patch.object(conn.features, "supports_timezones", False),
        ):
            messages = scheduling_checks.check_settings()
            self.assertEqual([m.id for m in messages], ["django_scheduling.E016"])
            self.assertIn("'default' has TIME_ZONE 'Europe/Paris'", messages[0].msg)
            self.assertIn("an alias of the same database without TIME_ZONE", messages[0].hint)
            with self.assertRaisesMessage(ImproperlyConfigured, "(django_scheduling.E016)"):
                SchedulerService([], tasks=TaskRegistry()).check()

    @override_settings(USE_TZ=False)
    def test_use_tz_false_stops_the_scheduler(self):
        from django_scheduling.runtime.service import SchedulerService

        with self.assertRaisesMessage(ImproperlyConfigured, "(django_scheduling.E006)"):
            SchedulerService([], tasks=TaskRegistry()).check()

    def test_the_project_passes_its_checks(self):
        self.assertEqual(scheduling_checks.check_settings(), [])
