"""Prometheus metrics: counted against real runs and their ``TaskRun`` rows, in this process and
under gunicorn with three workers in prometheus_client's multiprocess mode; ``runscheduler
--metrics-port`` with and without prometheus_client."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import urllib.request
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import gunicorn
import pytest
from django.test import SimpleTestCase, TransactionTestCase, override_settings
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from django_scheduling.locking import DatabaseLockProvider, LockConfiguration
from django_scheduling.models import RunStatus, ScheduledTask, TaskRun
from django_scheduling.observability import metrics
from django_scheduling.runtime.service import SchedulerService
from django_scheduling.tasks.registry import TaskRegistry

from .processes import ROOT, Process, manage, poll, process_env
from .test_autostart import free_port


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Return every sample of a scrape by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def runs(name: str, status: str) -> int:
    return TaskRun.objects.filter(task_name=name, status=status).count()


class InProcessMetricsTests(TransactionTestCase):
    """A live scheduler service in this process, and a scrape of the test project's
    ``/metrics``."""

    def setUp(self) -> None:
        # Other test modules clear the signals' receivers; connect this module's again.
        metrics.install()

    def test_runs_skips_and_locks_are_counted_as_the_history_records_them(self):
        # Held by another owner for the whole test: every firing of "m_locked" is skipped.
        other = DatabaseLockProvider(owner="another-instance")
        held = other.lock(LockConfiguration("m_locked", timedelta(minutes=5)))
        self.assertIsNotNone(held)

        def fail() -> None:
            raise ValueError("expected")

        definitions = TaskRegistry()
        tasks = [
            definitions.add(lambda: None, fixed_rate="200ms", name="m_ok"),
            definitions.add(fail, fixed_rate="200ms", name="m_fail"),
            definitions.add(lambda: None, fixed_rate="200ms", name="m_locked"),
        ]
        service = SchedulerService(tasks)
        service.start()
        self.addCleanup(service.stop, 5)
        poll(lambda: runs("m_ok", RunStatus.SUCCEEDED) >= 3, timeout=15)
        poll(lambda: runs("m_fail", RunStatus.FAILED) >= 3, timeout=15)
        poll(
            lambda: sample("django_scheduling_skipped_total", task="m_locked", reason="locked"),
            timeout=15,
        )
        service.stop(5)

        ok, failed = runs("m_ok", RunStatus.SUCCEEDED), runs("m_fail", RunStatus.FAILED)
        self.assertEqual(
            sample("django_scheduling_runs_total", task="m_ok", status="succeeded"), ok
        )
        self.assertEqual(
            sample("django_scheduling_runs_total", task="m_fail", status="failed"), failed
        )
        self.assertEqual(sample("django_scheduling_runs_total", task="m_ok", status="failed"), 0)
        self.assertEqual(sample("django_scheduling_run_duration_seconds_count", task="m_ok"), ok)
        self.assertEqual(sample("django_scheduling_lateness_seconds_count", task="m_fail"), failed)
        # Every run took its lock first; the locked task never did.
        self.assertGreaterEqual(
            sample("django_scheduling_lock_attempts_total", task="m_ok", acquired="true"), ok
        )
        self.assertEqual(
            sample("django_scheduling_lock_attempts_total", task="m_locked", acquired="true"), 0
        )
        self.assertEqual(
            sample("django_scheduling_lock_attempts_total", task="m_locked", acquired="false"),
            sample("django_scheduling_skipped_total", task="m_locked", reason="locked"),
        )
        self.assertFalse(TaskRun.objects.filter(task_name="m_locked").exists())
        last_success = sample("django_scheduling_last_success_timestamp_seconds", task="m_ok")
        finished = TaskRun.objects.filter(task_name="m_ok").latest("finished_at").finished_at
        self.assertAlmostEqual(last_success, finished.timestamp(), delta=2)
        self.assertEqual(
            sample("django_scheduling_last_success_timestamp_seconds", task="m_fail"), 0
        )
        self.assertTrue(held.unlock())

    def test_overdue_tasks_are_counted_at_scrape_time(self):
        now = datetime.now(UTC)
        ScheduledTask.objects.create(
            name="late",
            kind="fixed_rate",
            trigger="every 1m",
            next_fire_time=now - timedelta(hours=1),
        )
        samples = scrape(self.client.get("/metrics").content.decode())
        self.assertEqual(samples[("django_scheduling_overdue_tasks", ())], 1)
        ScheduledTask.objects.filter(name="late").update(paused=True)
        samples = scrape(self.client.get("/metrics").content.decode())
        self.assertEqual(samples[("django_scheduling_overdue_tasks", ())], 0)

    def test_a_database_that_fails_keeps_the_last_overdue_count(self):
        now = datetime.now(UTC)
        ScheduledTask.objects.create(
            name="late",
            kind="fixed_rate",
            trigger="every 1m",
            next_fire_time=now - timedelta(hours=1),
        )
        self.assertEqual(self.client.get("/metrics").status_code, 200)
        with override_settings(SCHEDULING={"DATABASE": "missing"}):
            response = self.client.get("/metrics")
        self.assertEqual(response.status_code, 200)
        self.assertEqual(
            scrape(response.content.decode())[("django_scheduling_overdue_tasks", ())], 1
        )


class MetricLockTests(SimpleTestCase):
    """A firing's metrics do not wait on a lock of the whole metric: every pool thread records
    every firing, and under a burst they queued on prometheus_client's ``labels()`` lock."""

    def setUp(self) -> None:
        metrics.install()

    def test_a_task_already_counted_is_counted_while_the_metrics_lock_is_held(self):
        # The receivers of run_started and run_succeeded, called as the pool thread calls them.
        metrics._started("m_hot", scheduled_at=datetime.now(UTC))
        metrics._succeeded("m_hot", duration=timedelta(seconds=1))
        names = [
            "django_scheduling_lateness_seconds",
            "django_scheduling_runs_total",
            "django_scheduling_run_duration_seconds",
            "django_scheduling_last_success_timestamp_seconds",
        ]
        # prometheus_client keeps the collector of each name, and each has its own lock.
        collectors = {REGISTRY._names_to_collectors[name] for name in names}
        before = sample("django_scheduling_runs_total", task="m_hot", status="succeeded")
        done = threading.Event()

        def fire() -> None:
            metrics._started("m_hot", scheduled_at=datetime.now(UTC))
            metrics._succeeded("m_hot", duration=timedelta(seconds=1))
            done.set()

        with ExitStack() as held:
            for collector in collectors:
                held.enter_context(collector._lock)
            thread = threading.Thread(target=fire)
            thread.start()
            self.assertTrue(done.wait(10), "the firing waited for the metrics' lock")
        thread.join()
        after = sample("django_scheduling_runs_total", task="m_hot", status="succeeded")
        self.assertEqual(after, before + 1)


@pytest.mark.processes
class GunicornMetricsTests(TransactionTestCase):
    """Three gunicorn workers, each with its scheduler, share prometheus_client's multiprocess
    directory; a scrape of any worker adds up all three."""

    def test_counts_match_the_history_across_three_workers(self):
        port = free_port()
        multiproc_dir = tempfile.mkdtemp(prefix="prometheus-")
        env = process_env(
            SCHEDULING_AUTOSTART="1",
            TESTAPP_TASKS="",
            TESTAPP_OBSERVABILITY="1",
            SCHEDULING_EXTRA=json.dumps({"TASK_MODULE": "observability_tasks", "METRICS": True}),
            PROMETHEUS_MULTIPROC_DIR=multiproc_dir,
        )
        options = ["--no-control-socket"] if gunicorn.version_info >= (25, 1) else []
        proc = Process(
            [
                sys.executable,
                "-m",
                "gunicorn",
                *options,
                "--workers",
                "3",
                "--bind",
                f"127.0.0.1:{port}",
                "django.core.wsgi:get_wsgi_application()",
            ],
            env,
        )
        self.addCleanup(proc.kill)
        poll(lambda: runs("observed_ok", RunStatus.SUCCEEDED) >= 3, timeout=30)
        poll(lambda: runs("observed_failing", RunStatus.FAILED) >= 3, timeout=30)
        # Paused, the tasks run no more: the counts settle, and pausing is counted as a skip.
        ScheduledTask.objects.update(paused=True)
        poll(lambda: not TaskRun.objects.filter(status=RunStatus.RUNNING).exists(), timeout=15)

        def fetch() -> dict:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                return scrape(r.read().decode())

        def settled() -> dict | None:
            samples = fetch()
            expected = {
                ("observed_ok", "succeeded"): runs("observed_ok", RunStatus.SUCCEEDED),
                ("observed_failing", "failed"): runs("observed_failing", RunStatus.FAILED),
            }
            counted = {
                key: samples.get(
                    (
                        "django_scheduling_runs_total",
                        (("status", key[1]), ("task", key[0])),
                    )
                )
                for key in expected
            }
            paused = samples.get(
                ("django_scheduling_skipped_total", (("reason", "paused"), ("task", "observed_ok")))
            )
            return samples if counted == expected and paused else None

        samples = poll(settled, timeout=20, interval=0.5, message="the counts did not match")
        # Each worker writes its own files; the scrape, served by one of them, added them up.
        writers = {path.stem.rsplit("_", 1)[1] for path in Path(multiproc_dir).glob("*.db")}
        self.assertGreaterEqual(len(writers), 3, sorted(writers))
        self.assertIn(("django_scheduling_pool_threads", ()), samples)
        self.assertGreaterEqual(samples[("django_scheduling_pool_threads", ())], 3)
        self.assertEqual(proc.stop(60), 0, proc.output)


@pytest.mark.processes
class MetricsPortTests(TransactionTestCase):
    def test_runscheduler_serves_metrics_on_its_port(self):
        port = free_port()
        env = process_env(
            TESTAPP_TASKS="",
            TESTAPP_OBSERVABILITY="1",
            SCHEDULING_EXTRA=json.dumps({"TASK_MODULE": "observability_tasks", "METRICS": True}),
        )
        proc = manage("runscheduler", "--metrics-port", str(port), env=env)
        self.addCleanup(proc.kill)
        proc.wait_for("Scheduler running", timeout=30)

        def counted() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                samples = scrape(r.read().decode())
            key = (("status", "succeeded"), ("task", "observed_ok"))
            return samples.get(("django_scheduling_runs_total", key), 0)

        poll(counted, timeout=20, interval=0.5)
        self.assertEqual(proc.stop(30), 0, proc.output)

    def test_without_prometheus_client_the_option_names_the_extra(self):
        # A real interpreter in which prometheus_client cannot be imported.
        blocked = (
            "import sys; sys.modules['prometheus_client'] = None; "
            "from django.core.management import execute_from_command_line; "
            "execute_from_command_line(sys.argv)"
        )
        env = process_env(TESTAPP_TASKS="")
        check = _run([sys.executable, "-c", blocked, "check"], env=env)
        self.assertEqual(check.returncode, 0, check.stderr)
        completed = _run(
            [sys.executable, "-c", blocked, "runscheduler", "--metrics-port", "9"], env=env
        )
        self.assertEqual(completed.returncode, 1, completed.stderr)
        self.assertIn('pip install "django-scheduling[prometheus]"', completed.stderr)
        self.assertNotIn("Traceback", completed.stderr)
        wanted = _run(
            [sys.executable, "-c", blocked, "check"],
            env={**env, "SCHEDULING_EXTRA": json.dumps({"METRICS": True})},
        )
        self.assertEqual(wanted.returncode, 1, wanted.stderr)
        self.assertIn("SCHEDULING['METRICS'] is True but prometheus_client", wanted.stderr)
        self.assertIn('pip install "django-scheduling[prometheus]"', wanted.stderr)
        self.assertNotIn("Traceback", wanted.stderr)

    def test_the_metrics_are_recorded_only_with_the_setting(self):
        probe = (
            "from django_scheduling.observability import metrics; "
            "print('recording', metrics._metrics is not None)"
        )
        for extra, expected in (({}, "recording False"), ({"METRICS": True}, "recording True")):
            with self.subTest(extra=extra):
                env = process_env(TESTAPP_TASKS="", SCHEDULING_EXTRA=json.dumps(extra))
                completed = _run([sys.executable, "manage.py", "shell", "-c", probe], env=env)
                self.assertEqual(completed.returncode, 0, completed.stderr)
                self.assertIn(expected, completed.stdout)


def _run(command: list[str], *, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run *command* in the project's directory with *env*, capturing its output."""
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
