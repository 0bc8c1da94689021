"""Sentry Crons: check-ins captured by the real sentry_sdk, through a transport that keeps the
envelopes, around runs of a live scheduler service; and the monitor_config of each trigger."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import sentry_sdk
from django.test import SimpleTestCase, TransactionTestCase, override_settings
from sentry_sdk.transport import Transport

from django_scheduling.conf import InvalidSettings, SchedulingSettings, get_settings
from django_scheduling.models import RunStatus, TaskRun
from django_scheduling.observability import sentry
from django_scheduling.observability.sentry import crontab, monitor_config, monitor_slug
from django_scheduling.runtime.service import SchedulerService
from django_scheduling.schedules.cron import CronExpression
from django_scheduling.tasks.registry import TaskRegistry

from .processes import poll


class CapturingTransport(Transport):
    """Keep each envelope's check-ins instead of sending them."""

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.check_ins: list[dict] = []
        self._lock = threading.Lock()

    def capture_envelope(self, envelope) -> None:
        for item in envelope.items:
            if item.type == "check_in":
                with self._lock:
                    self.check_ins.append(json.loads(item.payload.get_bytes()))


class CheckInTests(TransactionTestCase):
    def setUp(self) -> None:
        # Other test modules clear the signals' receivers; connect this module's again.
        sentry.install()
        self.transport = CapturingTransport()
        sentry_sdk.init(dsn="https://key@o1.ingest.sentry.io/1", transport=self.transport)
        self.addCleanup(sentry_sdk.init)  # no DSN: off again

    def run_tasks(self, *tasks, runs: int = 2) -> None:
        service = SchedulerService(list(tasks))
        service.start()
        self.addCleanup(service.stop, 5)
        for definition in tasks:
            # An hourly task runs once, at start.
            least = 1 if definition.name == "hourly" else runs
            poll(
                lambda name=definition.name, least=least: (
                    TaskRun.objects.filter(task_name=name, finished_at__isnull=False).count()
                    >= least
                ),
                timeout=20,
            )
        service.stop(5)

    @override_settings(SCHEDULING={"SENTRY_CRONS": True, "LOCK_AT_MOST_FOR": "90s"})
    def test_each_run_checks_in_progress_then_ok_or_error_with_its_duration(self):
        def fail() -> None:
            raise RuntimeError("broken")

        definitions = TaskRegistry()
        self.run_tasks(
            definitions.add(lambda: None, fixed_rate="200ms", name="Reports.Nightly"),
            definitions.add(fail, cron="* * * * * *", name="broken"),
            definitions.add(lambda: None, fixed_rate="1h", name="hourly"),
        )
        by_id: dict[str, list[dict]] = {}
        for check_in in self.transport.check_ins:
            by_id.setdefault(check_in["check_in_id"], []).append(check_in)
        runs = {
            "reports-nightly": TaskRun.objects.filter(task_name="Reports.Nightly").count(),
            "broken": TaskRun.objects.filter(task_name="broken").count(),
            "hourly": 1,
        }
        per_slug: dict[str, int] = {}
        for check_ins in by_id.values():
            slug = check_ins[0]["monitor_slug"]
            per_slug[slug] = per_slug.get(slug, 0) + 1
            self.assertEqual(
                [c["status"] for c in check_ins],
                ["in_progress", "ok" if slug != "broken" else "error"],
            )
            self.assertEqual({c["monitor_slug"] for c in check_ins}, {slug})
            self.assertIsNone(check_ins[0]["duration"])
            self.assertGreaterEqual(check_ins[1]["duration"], 0)
            self.assertNotIn("monitor_config", check_ins[1])
        self.assertEqual(per_slug, runs)
        [first_broken] = [c for c in self.transport.check_ins if c["monitor_slug"] == "broken"][:1]
        # Every second is not a crontab (its seconds field is "*"): no monitor_config.
        self.assertNotIn("monitor_config", first_broken)
        self.assertEqual(
            TaskRun.objects.filter(task_name="broken", status=RunStatus.FAILED).count(),
            runs["broken"],
        )
        [hourly, _] = [c for c in self.transport.check_ins if c["monitor_slug"] == "hourly"]
        self.assertEqual(
            hourly["monitor_config"],
            {
                "schedule": {"type": "interval", "value": 1, "unit": "hour"},
                "checkin_margin": 1,
                "max_runtime": 2,  # LOCK_AT_MOST_FOR 90 s, rounded up
            },
        )

    def test_off_by_default(self):
        definitions = TaskRegistry()
        self.run_tasks(definitions.add(lambda: None, fixed_rate="200ms", name="quiet"))
        self.assertEqual(self.transport.check_ins, [])


class MonitorConfigTests(SimpleTestCase):
    def config(self, **options):
        definitions = TaskRegistry()
        definition = definitions.add(lambda: None, name="t", **options)
        return monitor_config(definition, get_settings())

    def test_crontab_for_cron_expressions_that_fit_five_fields(self):
        cases = {
            "*/5 * * * *": "*/5 * * * *",
            "0 3 * * MON-FRI": "0 3 * * MON-FRI",
            "0 */5 * * * *": "*/5 * * * *",
            "0 0 3 ? * MON-FRI": "0 3 * * MON-FRI",
            "@daily": "0 0 * * *",
            "0 0 0 1,15 * *": "0 0 1,15 * *",
            "15 0 3 * * *": None,  # at second 15
            "*/10 * * * * *": None,
            "0 0 0 L * *": None,
            "0 0 12 ? * 2#1": None,
            "0 0 0 1 * MON": None,  # six fields: the 1st AND a Monday; cron would take either
            "0 0 1 * MON": "0 0 1 * MON",  # five fields: cron rules, either day
        }
        for text, expected in cases.items():
            with self.subTest(text=text):
                self.assertEqual(crontab(CronExpression(text)), expected)

    @override_settings(
        SCHEDULING={"MISFIRE_THRESHOLD": "5s", "JITTER": "0s"}, TIME_ZONE="Europe/Berlin"
    )
    def test_cron_config_with_zone_margin_and_runtime(self):
        self.assertEqual(
            self.config(cron="0 0 3 * * *", lock_at_most_for="30m"),
            {
                "schedule": {"type": "crontab", "value": "0 3 * * *"},
                "timezone": "Europe/Berlin",
                "checkin_margin": 1,
                "max_runtime": 30,
            },
        )
        config = self.config(cron="0 30 2 * * *", zone="America/New_York", jitter="150s")
        self.assertEqual(config["timezone"], "America/New_York")
        self.assertEqual(config["checkin_margin"], 3)  # 5 s + 150 s, rounded up
        self.assertEqual(config["max_runtime"], 10)  # LOCK_AT_MOST_FOR

    def test_interval_for_fixed_rate(self):
        cases = {
            timedelta(minutes=5): {"type": "interval", "value": 5, "unit": "minute"},
            timedelta(hours=2): {"type": "interval", "value": 2, "unit": "hour"},
            timedelta(days=1): {"type": "interval", "value": 1, "unit": "day"},
            timedelta(days=14): {"type": "interval", "value": 2, "unit": "week"},
            timedelta(minutes=90): {"type": "interval", "value": 90, "unit": "minute"},
        }
        for period, schedule in cases.items():
            with self.subTest(period=period):
                config = self.config(fixed_rate=period)
                self.assertEqual(config["schedule"], schedule)
                self.assertNotIn("timezone", config)
        self.assertIsNone(self.config(fixed_rate="30s"))
        self.assertIsNone(self.config(fixed_rate="90s"))
        self.assertIsNone(self.config(fixed_delay="5m"))

    def test_slugs(self):
        self.assertEqual(monitor_slug("Reports.Nightly"), "reports-nightly")
        self.assertEqual(monitor_slug("app.tasks:clean_up"), "app-tasks-clean_up")
        self.assertEqual(len(monitor_slug("x" * 200)), 50)

    def test_the_setting_needs_sentry_sdk_installed(self):
        # sentry_sdk is installed here: the setting is accepted.
        self.assertTrue(SchedulingSettings.from_dict({"SENTRY_CRONS": True}).sentry_crons)
        with self.assertRaises(InvalidSettings):
            SchedulingSettings.from_dict({"SENTRY_CRONS": "yes"})
