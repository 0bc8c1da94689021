"""One firing through the real runner, lock provider and database.

Two runners with different instance names stand for two instances; their clocks are injected,
so clock skew is exact and no test waits for a fire time.
"""

import dataclasses
import threading
import time
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.test import TransactionTestCase

from django_scheduling import signals
from django_scheduling.conf import get_settings
from django_scheduling.locking import (
    BaseLockProvider,
    DatabaseLockProvider,
    LockConfiguration,
    LockError,
)
from django_scheduling.models import RunStatus, ScheduledTask, TaskLock, TaskRun
from django_scheduling.observability.events import run_events
from django_scheduling.runtime.firing import FiringPipeline
from django_scheduling.runtime.keepalive import KeepAlive
from django_scheduling.runtime.scheduler import Entry, RunRequest
from django_scheduling.tasks.registry import TaskRegistry

T0 = datetime(2026, 5, 13, 12, 0, 0, tzinfo=UTC)
DEADLINE = 10.0


class Clock:
    def __init__(self, start, offset=timedelta(0)):
        self.now = start
        self.offset = offset

    def __call__(self):
        return self.now + self.offset


def make_runner(name, clock, provider=None):
    conf = dataclasses.replace(get_settings(), instance_name=name)
    return FiringPipeline(
        conf=conf,
        provider=provider or DatabaseLockProvider(owner=name),
        default_zone=UTC,
        clock=clock,
    )


class Calls:
    def __init__(self, error=None):
        self.count = 0
        self.error = error

    def __call__(self):
        self.count += 1
        if self.error:
            raise self.error


class ExecutionTests(TransactionTestCase):
    def setUp(self):
        self.registry = TaskRegistry()
        self.clock = Clock(T0)

    def task(self, func, **options):
        options.setdefault("name", "job")
        return self.registry.add(func, **options)

    def entry(self, runner, definition):
        (spec,) = runner.specs([definition], complete=False)
        return Entry(spec.name, spec)

    def test_a_firing_runs_and_is_recorded(self):
        calls = Calls()
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, self.task(calls, fixed_rate="10s"))
        first = runner.first_fire_time(entry, now=self.clock())
        self.assertEqual(first, T0)
        next_time = runner.run(entry, first)
        self.assertEqual(calls.count, 1)
        self.assertEqual(next_time, T0 + timedelta(seconds=10))
        run = TaskRun.objects.get()
        self.assertEqual(
            (run.task_name, run.status, run.scheduled_at, run.instance),
            ("job", RunStatus.SUCCEEDED, T0, "a"),
        )
        self.assertIsNotNone(run.finished_at)
        row = ScheduledTask.objects.get(name="job")
        self.assertEqual(row.last_fire_time, T0)
        self.assertEqual(row.last_run_id, run.pk)
        self.assertEqual(row.next_fire_time, T0 + timedelta(seconds=10))
        # The lock was released: another instance could take it now.
        self.assertLessEqual(TaskLock.objects.get(name="job").lock_until, datetime.now(UTC))

    def test_a_run_logs_its_start_and_its_end_at_info(self):
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, self.task(Calls(), fixed_rate="10s"))
        with self.assertLogs("django_scheduling.runtime.firing.invoke", "INFO") as logs:
            runner.run(entry, T0)
        started, ended = (record.getMessage() for record in logs.records)
        self.assertEqual(started, f"Running job (scheduled for {T0.isoformat()})")
        self.assertRegex(ended, r"^Task job succeeded in \d+\.\d ms$")

    def test_a_failing_task_is_recorded_and_keeps_its_schedule(self):
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, self.task(Calls(ValueError("bad <input>")), fixed_rate="10s"))
        next_time = runner.run(entry, T0)
        self.assertEqual(next_time, T0 + timedelta(seconds=10))
        run = TaskRun.objects.get()
        self.assertEqual(run.status, RunStatus.FAILED)
        self.assertEqual(run.error_type, "builtins.ValueError")
        self.assertEqual(run.error_message, "bad <input>")
        self.assertIn("Traceback", run.traceback)
        self.clock.now = T0 + timedelta(seconds=10)
        runner.run(entry, next_time)
        self.assertEqual(TaskRun.objects.count(), 2)

    def test_sys_exit_in_a_task_fails_the_run_and_keeps_the_schedule(self):
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, self.task(Calls(SystemExit(3)), fixed_rate="10s"))
        self.assertEqual(runner.run(entry, T0), T0 + timedelta(seconds=10))
        run = TaskRun.objects.get()
        self.assertEqual((run.status, run.error_type), (RunStatus.FAILED, "builtins.SystemExit"))

    def test_the_same_firing_runs_once_across_instances(self):
        calls = Calls()
        definition = self.task(calls, fixed_rate="1s")
        a = make_runner("a", Clock(T0))
        b = make_runner("b", Clock(T0, offset=timedelta(milliseconds=300)))  # b's clock is ahead
        entry_a, entry_b = self.entry(a, definition), self.entry(b, definition)
        # Both compute the same grid from the shared anchor, whatever their clocks say.
        self.assertEqual(a.first_fire_time(entry_a, now=T0), T0)
        self.assertEqual(b.first_fire_time(entry_b, now=T0), T0)
        next_a = a.run(entry_a, T0)  # a runs T0 quickly and releases the lock
        next_b = b.run(entry_b, T0)  # b gets the lock but finds T0 claimed
        self.assertEqual(calls.count, 1)
        self.assertEqual(next_a, T0 + timedelta(seconds=1))
        self.assertEqual(next_b, T0 + timedelta(seconds=1))
        self.assertEqual(b.skipped, 1)
        self.assertEqual(TaskRun.objects.get().instance, "a")

    def test_a_slow_clock_does_not_run_a_firing_again(self):
        calls = Calls()
        definition = self.task(calls, cron="* * * * * *")
        a = make_runner("a", Clock(T0 + timedelta(milliseconds=5)))
        slow = Clock(T0 - timedelta(seconds=2))  # b is 2 s behind
        b = make_runner("b", slow)
        entry_a, entry_b = self.entry(a, definition), self.entry(b, definition)
        fire = T0 + timedelta(seconds=1)
        a.clock.now = fire
        a.run(entry_a, fire)
        slow.now = fire  # b's clock reaches the same fire time later, in real time
        b.run(entry_b, fire)
        self.assertEqual(calls.count, 1)

    def test_an_instance_that_finds_the_lock_held_skips_without_waiting(self):
        calls = Calls()
        definition = self.task(calls, fixed_rate="1s")
        b = make_runner("b", Clock(T0))
        entry_b = self.entry(b, definition)
        holder = DatabaseLockProvider(owner="a").lock(LockConfiguration("job", "1m"))
        self.assertIsNotNone(holder)
        received = []

        def on_run_skipped(sender, **kw):
            return received.append(kw["reason"])

        signals.run_skipped.connect(on_run_skipped, weak=False)
        self.addCleanup(signals.run_skipped.disconnect, on_run_skipped)
        next_b = b.run(entry_b, T0)
        self.assertEqual(calls.count, 0)
        self.assertEqual(next_b, T0 + timedelta(seconds=1))
        run_events.drain(DEADLINE)  # the signals go out from the events thread
        self.assertEqual(received, ["locked"])
        holder.unlock()

    def test_fixed_delay_follows_the_finish_of_another_instance(self):
        definition = self.task(Calls(), fixed_delay="5s")
        a = make_runner("a", Clock(T0))
        entry_a = self.entry(a, definition)
        a.clock.now = T0 + timedelta(seconds=1)  # the run "takes" a second by a's clock
        a.run(entry_a, T0)
        b = make_runner("b", Clock(T0 + timedelta(seconds=3)))
        entry_b = self.entry(b, definition)
        self.assertEqual(b.first_fire_time(entry_b, now=b.clock()), T0 + timedelta(seconds=6))

    def test_a_paused_task_skips_its_firing_on_every_instance(self):
        calls = Calls()
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, self.task(calls, fixed_rate="10s"))
        ScheduledTask.objects.filter(name="job").update(paused=True)
        next_time = runner.run(entry, T0)
        self.assertEqual(calls.count, 0)
        self.assertEqual(next_time, T0 + timedelta(seconds=10))
        self.assertEqual(ScheduledTask.objects.get(name="job").last_fire_time, T0)
        ScheduledTask.objects.filter(name="job").update(paused=False)
        self.clock.now = T0 + timedelta(seconds=10)
        runner.run(entry, next_time)
        self.assertEqual(calls.count, 1)

    def test_no_lock_no_run_when_the_database_fails(self):
        class Down(BaseLockProvider):
            def lock(self, config):
                raise LockError("connection refused")

        calls = Calls()
        runner = make_runner("a", self.clock, provider=Down())
        entry = self.entry(runner, self.task(calls, fixed_rate="10s"))
        retry = runner.run(entry, T0)
        self.assertEqual(calls.count, 0)
        self.assertEqual(retry, T0 + timedelta(seconds=1))
        self.assertEqual(runner.run(entry, T0), T0 + timedelta(seconds=2))  # backing off
        self.assertEqual(TaskRun.objects.count(), 0)

    def test_unlocked_tasks_run_on_every_instance(self):
        calls = Calls()
        definition = self.task(calls, fixed_rate="1s", lock=False)
        for name in ("a", "b"):
            runner = make_runner(name, Clock(T0))
            runner.run(self.entry(runner, definition), T0)
        self.assertEqual(calls.count, 2)
        self.assertFalse(TaskLock.objects.exists())

    def test_a_manual_run_is_recorded_without_a_fire_time(self):
        calls = Calls()
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, self.task(calls, fixed_rate="1h"))
        runner.run(entry, RunRequest())
        self.assertEqual(calls.count, 1)
        run = TaskRun.objects.get()
        self.assertIsNone(run.scheduled_at)
        self.assertIsNone(ScheduledTask.objects.get(name="job").last_fire_time)

    def test_signals_around_a_run(self):
        events = []

        def receiver(signal_name):
            def handler(sender, **kwargs):
                events.append((signal_name, sender, kwargs["scheduled_at"]))

            return handler

        handlers = {
            "started": receiver("started"),
            "succeeded": receiver("succeeded"),
            "failed": receiver("failed"),
        }
        signals.run_started.connect(handlers["started"])
        signals.run_succeeded.connect(handlers["succeeded"])
        signals.run_failed.connect(handlers["failed"])
        self.addCleanup(signals.run_started.disconnect, handlers["started"])
        self.addCleanup(signals.run_succeeded.disconnect, handlers["succeeded"])
        self.addCleanup(signals.run_failed.disconnect, handlers["failed"])
        runner = make_runner("a", self.clock)
        runner.run(self.entry(runner, self.task(Calls(), fixed_rate="1s")), T0)
        failing = self.task(Calls(RuntimeError("x")), fixed_rate="1s", name="failing")
        runner.run(self.entry(runner, failing), T0)
        self.assertTrue(run_events.drain(10))  # the signals go out from the events thread
        self.assertEqual(
            events,
            [
                ("started", "job", T0),
                ("succeeded", "job", T0),
                ("started", "failing", T0),
                ("failed", "failing", T0),
            ],
        )

    def test_the_lock_is_kept_alive_while_a_long_task_runs(self):
        started, release = threading.Event(), threading.Event()
        self.addCleanup(release.set)

        def long_task():
            started.set()
            release.wait(30)

        runner = make_runner("a", lambda: datetime.now(UTC))
        runner.keepalive = KeepAlive()
        runner.keepalive.start()
        self.addCleanup(runner.keepalive.stop)
        # The keep-alive extends at half of lock_at_most_for: 1 s of margin for its thread
        # and the database's answer on a loaded machine (400 ms, 200 ms of margin, once
        # expired under the test command's load).
        definition = self.task(long_task, fixed_rate="1h", lock_at_most_for="2s")
        entry = self.entry(runner, definition)
        worker = threading.Thread(target=runner.run, args=(entry, runner.clock()))
        worker.start()
        self.assertTrue(started.wait(10))
        first_expiry = TaskLock.objects.get(name="job").lock_until
        # Once the database's clock is past the first expiry, the lock is still held: the
        # keep-alive extended it.
        poll_until(lambda: database_now() > first_expiry + timedelta(milliseconds=100))
        other = DatabaseLockProvider(owner="b")
        self.assertIsNone(other.lock(LockConfiguration("job", "1m")))
        self.assertGreater(TaskLock.objects.get(name="job").lock_until, first_expiry)
        release.set()
        worker.join(10)
        run = TaskRun.objects.get()
        self.assertEqual((run.status, run.lock_lost), (RunStatus.SUCCEEDED, False))
        lock = other.lock(LockConfiguration("job", "1m"))
        self.assertIsNotNone(lock)  # released at the end
        lock.unlock()


def database_now():
    """Return "now" by the clock the locks use: the server's on MySQL, this host's on SQLite."""
    from django.db import connection

    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT UTC_TIMESTAMP(6)")
            return cursor.fetchone()[0].replace(tzinfo=UTC)
    return datetime.now(UTC)


def poll_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        threading.Event().wait(0.02)


class ContextTests(TransactionTestCase):
    def test_an_async_task_sees_its_fire_time_through_sync_to_async(self):
        from asgiref.sync import sync_to_async

        from django_scheduling import current_fire_time

        seen = []

        async def task():
            seen.append(current_fire_time())
            seen.append(await sync_to_async(current_fire_time)())

        registry = TaskRegistry()
        runner = make_runner("a", Clock(T0))
        (spec,) = runner.specs([registry.add(task, fixed_rate="1s", name="async")], complete=False)
        runner.run(Entry(spec.name, spec), T0)
        self.assertEqual(seen, [T0, T0])
        self.assertIsNone(current_fire_time())


class ThreadStateTests(TransactionTestCase):
    def test_a_task_leaves_no_language_or_time_zone_behind(self):
        from django.utils import timezone, translation

        def meddle():
            translation.activate("de")
            timezone.activate("Asia/Tokyo")

        registry = TaskRegistry()
        runner = make_runner("a", Clock(T0))
        (spec,) = runner.specs(
            [registry.add(meddle, fixed_rate="1s", name="meddler")], complete=False
        )
        default_language = translation.get_language()
        runner.run(Entry(spec.name, spec), T0)
        self.assertEqual(translation.get_language(), default_language)
        self.assertEqual(timezone.get_current_timezone_name(), "UTC")


class WorkerConnectionTests(TransactionTestCase):
    """A run checks its thread's database connections before the task, as Django does
    before a request: a task never starts on a connection past ``CONN_MAX_AGE``."""

    def test_a_run_closes_an_obsolete_connection_of_its_thread_first(self):
        found = []

        def task():
            found.append(connection.connection)

        registry = TaskRegistry()
        runner = make_runner("a", Clock(T0))
        (spec,) = runner.specs(
            [registry.add(task, fixed_rate="1s", name="uses_db")], complete=False
        )
        entry = Entry(spec.name, spec)

        def work():
            try:
                runner.run(entry, T0)
                connection.ensure_connection()
                connection.close_at = time.monotonic() - 1  # past CONN_MAX_AGE
                runner.run(entry, T0 + timedelta(seconds=1))
            finally:
                connection.close()

        thread = threading.Thread(target=work)
        thread.start()
        thread.join(DEADLINE)
        self.assertEqual(len(found), 2)
        self.assertIsNone(found[1])  # closed before the second run's task
