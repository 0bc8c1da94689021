"""Timeouts, retries and the trace of missed fire times, through the real runner, lock
provider and database: one firing at a time (``run``) and in batches (``run_batch``).

Clocks are injected; what waits in real time is the behaviour under test (a retry's back-off
of milliseconds, a task that runs until ``cancel_requested()`` turns true).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from django.test import SimpleTestCase, TransactionTestCase

from django_scheduling import cancel_requested, signals
from django_scheduling.context import RunTimedOut
from django_scheduling.models import RunStatus, ScheduledTask, TaskRun
from django_scheduling.observability.events import run_events
from django_scheduling.schedules.decisions import retry_delay
from django_scheduling.schedules.triggers import MISSED_COUNT_LIMIT, TriggerState, make_trigger
from django_scheduling.tasks.registry import TaskRegistry

from .test_batches import Instance
from .test_execution import Clock, make_runner

T0 = datetime(2026, 5, 13, 12, 0, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)
DEADLINE = 10.0


class Flaky:
    """Fail the first *failures* calls, then succeed."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ValueError(f"failure {self.calls}")


class UntilCancelled:
    """Run until ``cancel_requested()`` turns true (at most DEADLINE seconds); note it."""

    def __init__(self) -> None:
        self.cancelled: bool | None = None

    def __call__(self) -> None:
        stop = time.monotonic() + DEADLINE
        while not cancel_requested() and time.monotonic() < stop:
            time.sleep(0.005)
        self.cancelled = cancel_requested()


class RetryDelayTests(SimpleTestCase):
    def test_doubles_up_to_the_cap_and_jitter_shortens_by_at_most_half(self):
        backoff, cap = timedelta(seconds=2), timedelta(seconds=10)
        self.assertEqual(
            [retry_delay(n, backoff, cap, 0.0) for n in (1, 2, 3, 4, 5)],
            [2 * SECOND, 4 * SECOND, 8 * SECOND, 10 * SECOND, 10 * SECOND],
        )
        self.assertEqual(retry_delay(2, backoff, cap, 0.5), 3 * SECOND)
        self.assertGreater(retry_delay(2, backoff, cap, 0.999), 2 * SECOND)


class MissedCountTests(SimpleTestCase):
    """The fire times a policy coalesced or skipped before the one that runs, per trigger."""

    def test_fixed_rate(self):
        trigger = make_trigger(fixed_rate="5s")
        state = TriggerState(anchor=T0, last_fire_time=T0)
        self.assertEqual(trigger.missed_before(T0 + 5 * SECOND, state=state), 0)
        self.assertEqual(trigger.missed_before(T0 + 20 * SECOND, state=state), 3)
        # Never run: counted from the anchor, which is the first fire time.
        self.assertEqual(trigger.missed_before(T0 + 10 * SECOND, state=TriggerState(T0)), 2)

    def test_cron_in_a_dst_zone(self):
        trigger = make_trigger(cron="0 30 * * * *", zone="Europe/Berlin")
        # 2026-03-29: 02:30 Berlin does not exist; the hours skip from 01:30 to 03:30 local.
        last = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # 01:30 CET
        due = datetime(2026, 3, 29, 3, 30, tzinfo=UTC)  # 05:30 CEST
        state = TriggerState(anchor=last, last_fire_time=last)
        # 03:30 and 04:30 CEST passed without a run; 02:30 never existed.
        self.assertEqual(trigger.missed_before(due, state=state), 2)

    def test_a_month_of_seconds_is_not_walked_past_the_limit(self):
        trigger = make_trigger(cron="* * * * * *")
        state = TriggerState(anchor=T0, last_fire_time=T0)
        count = trigger.missed_before(T0 + timedelta(days=30), state=state)
        self.assertEqual(count, MISSED_COUNT_LIMIT)

    def test_fixed_delay_and_one_shot_miss_nothing(self):
        for trigger in (make_trigger(fixed_delay="5s"), make_trigger(at=T0)):
            with self.subTest(trigger=trigger.describe()):
                state = TriggerState(anchor=T0, last_fire_time=T0)
                self.assertEqual(trigger.missed_before(T0 + timedelta(hours=1), state=state), 0)


class RecordedTests(TransactionTestCase):
    def setUp(self) -> None:
        self.registry = TaskRegistry()
        self.clock = Clock(T0)

    def entry(self, runner, func, **options):
        from django_scheduling.runtime.scheduler import Entry

        options.setdefault("name", "job")
        (spec,) = runner.specs([self.registry.add(func, **options)], complete=False)
        return Entry(spec.name, spec)

    # -- retries -----------------------------------------------------------------------------

    def test_a_failed_run_is_tried_again_on_the_same_fire_time_until_it_succeeds(self):
        flaky = Flaky(failures=2)
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, flaky, fixed_rate="1m", retries=2, retry_backoff="10ms")
        ended = []
        signals.run_failed.connect(
            lambda sender, run, **kwargs: ended.append(run), weak=False, dispatch_uid="t-failed"
        )
        self.addCleanup(signals.run_failed.disconnect, dispatch_uid="t-failed")
        next_time = runner.run(entry, T0)
        self.assertEqual(flaky.calls, 3)
        self.assertEqual(next_time, T0 + timedelta(minutes=1))
        runs = list(TaskRun.objects.order_by("attempt"))
        self.assertEqual(
            [(r.attempt, r.status, r.scheduled_at, r.error_message) for r in runs],
            [
                (1, RunStatus.FAILED, T0, "failure 1"),
                (2, RunStatus.FAILED, T0, "failure 2"),
                (3, RunStatus.SUCCEEDED, T0, ""),
            ],
        )
        # Under one lock: every attempt names the same acquisition.
        self.assertEqual(len({r.locked_at for r in runs}), 1)
        self.assertTrue(run_events.drain(10))  # the signals go out from the events thread
        self.assertEqual(ended, [runs[0].pk, runs[1].pk])  # each failed attempt, once
        row = ScheduledTask.objects.get(name="job")
        self.assertEqual((row.last_fire_time, row.last_run_id), (T0, runs[0].pk))

    def test_retries_stop_when_they_are_spent(self):
        flaky = Flaky(failures=5)
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, flaky, fixed_rate="1m", retries=1, retry_backoff="10ms")
        runner.run(entry, T0)
        self.assertEqual(flaky.calls, 2)
        self.assertEqual(
            list(TaskRun.objects.order_by("attempt").values_list("attempt", "status")),
            [(1, RunStatus.FAILED), (2, RunStatus.FAILED)],
        )

    def test_a_retry_never_reaches_the_next_fire_time(self):
        flaky = Flaky(failures=1)
        runner = make_runner("a", self.clock)
        # The first retry would wait 5 to 10 s; the next fire time comes 2 s after this one.
        entry = self.entry(runner, flaky, fixed_rate="2s", retries=3, retry_backoff="10s")
        with self.assertLogs("django_scheduling.runtime.firing", "WARNING") as logs:
            runner.run(entry, T0)
        self.assertEqual(flaky.calls, 1)
        self.assertEqual(TaskRun.objects.get().status, RunStatus.FAILED)
        self.assertIn("which comes first", "\n".join(logs.output))

    def test_a_stop_ends_the_wait_for_a_retry(self):
        flaky = Flaky(failures=1)
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, flaky, fixed_rate="1h", retries=1, retry_backoff="30m")
        threading.Timer(0.2, runner.stopping.set).start()
        started = time.monotonic()
        runner.run(entry, T0)
        self.assertLess(time.monotonic() - started, DEADLINE)
        self.assertEqual(flaky.calls, 1)

    def test_a_batched_firing_is_retried_and_each_attempt_recorded(self):
        flaky = Flaky(failures=1)
        a = Instance("a", self.clock)
        self.addCleanup(a.stop)
        definition = self.registry.add(
            flaky, name="job", fixed_rate="1m", retries=2, retry_backoff="10ms"
        )
        entries = a.entries([definition])
        a.run_calls(entries, a.batch(entries, T0))
        self.assertEqual(flaky.calls, 2)
        self.assertEqual(
            list(TaskRun.objects.order_by("attempt").values_list("attempt", "status")),
            [(1, RunStatus.FAILED), (2, RunStatus.SUCCEEDED)],
        )
        self.assertEqual(a.next_times["job"], T0 + timedelta(minutes=1))

    # -- timeouts ----------------------------------------------------------------------------

    def test_a_run_past_its_timeout_is_asked_to_stop_and_recorded_timed_out(self):
        task = UntilCancelled()
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, task, fixed_rate="1m", timeout="50ms")
        failed = []
        signals.run_failed.connect(
            lambda sender, exception, **kw: failed.append(exception),
            weak=False,
            dispatch_uid="t-timeout",
        )
        self.addCleanup(signals.run_failed.disconnect, dispatch_uid="t-timeout")
        runner.run(entry, T0)
        self.assertTrue(task.cancelled)
        run = TaskRun.objects.get()
        self.assertEqual(run.status, RunStatus.TIMED_OUT)
        self.assertEqual(run.timeout_at, T0 + timedelta(milliseconds=50))
        self.assertEqual(run.error_type, "django_scheduling.context.RunTimedOut")
        self.assertIn("past its timeout of 50ms; then succeeded", run.error_message)
        self.assertTrue(run_events.drain(10))  # the signals go out from the events thread
        [exception] = failed
        self.assertIsInstance(exception, RunTimedOut)

    def test_a_run_within_its_timeout_is_not_asked_to_stop(self):
        seen = []
        runner = make_runner("a", self.clock)
        entry = self.entry(
            runner, lambda: seen.append(cancel_requested()), fixed_rate="1m", timeout="1h"
        )
        runner.run(entry, T0)
        self.assertEqual(seen, [False])
        self.assertEqual(TaskRun.objects.get().status, RunStatus.SUCCEEDED)

    def test_the_setting_gives_the_default_timeout(self):
        import dataclasses

        runner = make_runner("a", self.clock)
        runner.conf = dataclasses.replace(runner.conf, timeout=timedelta(minutes=5))
        entry = self.entry(runner, lambda: None, fixed_rate="1m")
        self.assertEqual(entry.payload.timeout, timedelta(minutes=5))
        runner.run(entry, T0)
        self.assertEqual(TaskRun.objects.get().timeout_at, T0 + timedelta(minutes=5))

    def test_a_run_past_its_timeout_is_reported_once_while_it_runs(self):
        started, release = threading.Event(), threading.Event()

        def hang() -> None:
            started.set()
            release.wait(DEADLINE)

        runner = make_runner("a", self.clock)
        entry = self.entry(runner, hang, fixed_rate="1m", timeout="1s")
        thread = threading.Thread(target=runner.run, args=(entry, T0))
        thread.start()
        self.addCleanup(thread.join, DEADLINE)
        self.addCleanup(release.set)
        self.assertTrue(started.wait(DEADLINE))
        now = time.monotonic()
        self.assertEqual(runner.watch_timeouts(now), [])  # within its second
        with self.assertLogs("django_scheduling.runtime.firing", "WARNING") as logs:
            self.assertEqual(runner.watch_timeouts(now + 2), ["job"])
        self.assertIn("has passed its timeout of 1s", logs.output[0])
        self.assertEqual(runner.watch_timeouts(now + 3), [])  # once
        self.assertEqual(list(runner.running()), ["job"])

    # -- the trace of missed fire times ------------------------------------------------------

    def test_coalesced_fire_times_are_counted_on_the_run_that_served_them(self):
        runner = make_runner("a", self.clock)
        entry = self.entry(runner, lambda: None, fixed_rate="5s")
        runner.run(entry, T0)
        self.clock.now = T0 + 22 * SECOND  # 5, 10, 15 and 20 s passed: 20 s runs for them all
        runner.run(entry, T0 + 5 * SECOND)
        runs = list(
            TaskRun.objects.order_by("started_at").values_list("scheduled_at", "missed_count")
        )
        self.assertEqual(runs, [(T0, 0), (T0 + 20 * SECOND, 3)])

    def test_batched_runs_carry_their_missed_count(self):
        a = Instance("a", self.clock)
        self.addCleanup(a.stop)
        definition = self.registry.add(lambda: None, name="job", fixed_rate="5s")
        entries = a.entries([definition])
        a.run_calls(entries, a.batch(entries, T0))
        self.clock.now = T0 + 16 * SECOND
        a.run_calls(entries, a.batch(entries, T0 + 5 * SECOND))
        runs = list(
            TaskRun.objects.order_by("started_at").values_list("scheduled_at", "missed_count")
        )
        self.assertEqual(runs, [(T0, 0), (T0 + 15 * SECOND, 2)])
