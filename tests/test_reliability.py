"""Redeploys, outages, lost locks and lost runs, through the real runner and database.

Clocks are injected, so every time here is exact; a "dead" holder is a lock row whose holder
never releases it, and a database failure is a real one (a table renamed away).
"""

import contextlib
import re
import socket
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.db import connection
from django.test import TransactionTestCase, override_settings
from django.test.utils import CaptureQueriesContext

from django_scheduling import current_fire_time, process, signals
from django_scheduling.clock import utcnow
from django_scheduling.locking import DatabaseLockProvider, LockConfiguration
from django_scheduling.models import RunStatus, ScheduledTask, TaskLock, TaskRun
from django_scheduling.observability.events import run_events
from django_scheduling.process import identity
from django_scheduling.runtime import maintenance
from django_scheduling.runtime.maintenance import free_locks_of_dead_processes, request_recoveries
from django_scheduling.runtime.scheduler import Entry, RunRequest
from django_scheduling.runtime.service import SchedulerService
from django_scheduling.storage import history
from django_scheduling.tasks.registry import TaskRegistry

from .processes import poll
from .test_execution import Calls, Clock, make_runner

T0 = datetime(2026, 5, 13, 9, 0, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


@contextlib.contextmanager
def table_gone(model):
    """Make *model*'s table unreachable (a real database error) while the block runs."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table}_away RENAME TO {table}")


class NoScheduler:
    """A scheduler for a maintenance pass to talk to, with no tasks: it runs nothing."""

    def run_now(self, name, request):
        return False

    def wake(self, predicate):
        return []


class Base(TransactionTestCase):
    def entry(self, runner, definition):
        (spec,) = runner.specs([definition], complete=False)
        return Entry(spec.name, spec)


class TriggerChangeTests(Base):
    def ran_at(self, definition, fire_time):
        """Deploy *definition* a second before *fire_time* and run that fire time."""
        runner = make_runner("a", Clock(fire_time - SECOND))
        entry = self.entry(runner, definition)
        runner.clock.now = fire_time
        runner.run(entry, fire_time)
        self.assertEqual(ScheduledTask.objects.get(name="job").last_fire_time, fire_time)

    def test_a_changed_cron_does_not_run_a_time_that_passed_before_the_change(self):
        calls = Calls()
        self.ran_at(TaskRegistry().add(calls, cron="* * * * * *", name="job"), T0 - 10 * SECOND)
        # Redeployed 7 s after the new hourly time (09:00:00) had passed.
        deployed = T0 + 7 * SECOND
        new = TaskRegistry().add(calls, cron="0 0 * * * *", name="job")
        runner = make_runner("a", Clock(deployed))
        entry = self.entry(runner, new)
        self.assertEqual(runner.first_fire_time(entry, now=deployed), T0 + timedelta(hours=1))

    def test_run_all_does_not_replay_fire_times_from_before_the_change(self):
        calls = Calls()
        five = TaskRegistry().add(calls, cron="0 */5 * * * *", name="job", missed="run_all")
        self.ran_at(five, T0 - timedelta(hours=2))
        changed = TaskRegistry().add(calls, cron="0 */10 * * * *", name="job", missed="run_all")
        runner = make_runner("a", Clock(T0 + SECOND))
        entry = self.entry(runner, changed)
        self.assertEqual(runner.first_fire_time(entry, now=T0 + SECOND), T0 + timedelta(minutes=10))

    def test_a_changed_zone_is_a_changed_trigger(self):
        calls = Calls()
        berlin = TaskRegistry().add(calls, cron="0 0 * * * *", zone="Europe/Berlin", name="job")
        self.ran_at(berlin, T0 - timedelta(hours=1))
        later = T0 + timedelta(minutes=30, seconds=7)
        kolkata = TaskRegistry().add(calls, cron="0 0 * * * *", zone="Asia/Kolkata", name="job")
        runner = make_runner("a", Clock(later))
        entry = self.entry(runner, kolkata)
        # Kolkata's hour struck at 09:30 UTC, 7 s before the deploy: it is not run.
        self.assertEqual(runner.first_fire_time(entry, now=later), T0 + timedelta(minutes=90))

    def test_a_moved_one_shot_fires_at_its_new_time(self):
        calls = Calls()
        runner = make_runner("a", Clock(T0))
        first = TaskRegistry().add(calls, at=T0, name="once")
        runner.run(self.entry(runner, first), T0)
        moved = TaskRegistry().add(calls, at=T0 + timedelta(days=1), name="once")
        clock = Clock(T0 + timedelta(hours=1))
        runner = make_runner("a", clock)
        entry = self.entry(runner, moved)
        self.assertEqual(runner.first_fire_time(entry, now=clock()), T0 + timedelta(days=1))
        clock.now = T0 + timedelta(days=1)
        self.assertIsNone(runner.run(entry, clock.now))
        self.assertEqual(calls.count, 2)

    def test_an_older_deployment_neither_runs_nor_claims_its_trigger(self):
        blue_calls, green_calls = Calls(), Calls()
        blue = make_runner("blue", Clock(T0))
        blue_entry = self.entry(blue, TaskRegistry().add(blue_calls, fixed_rate="10s", name="job"))
        green = make_runner("green", Clock(T0 + 3 * SECOND))
        green_entry = self.entry(
            green, TaskRegistry().add(green_calls, fixed_rate="1m", name="job")
        )
        with self.assertLogs("django_scheduling.runtime.firing", "WARNING") as logs:
            blue.run(blue_entry, T0 + 10 * SECOND)
        self.assertIn("another deployment declared a different trigger", logs.output[0])
        self.assertEqual(blue_calls.count, 0)
        green.clock.now = T0 + 3 * SECOND
        green.run(green_entry, T0 + 3 * SECOND)
        self.assertEqual(green_calls.count, 1)
        self.assertEqual(ScheduledTask.objects.get(name="job").last_fire_time, T0 + 3 * SECOND)


class RunRequestTests(Base):
    def test_a_run_request_waits_while_the_lock_is_held_elsewhere(self):
        calls = Calls()
        runner = make_runner("a", Clock(T0))
        entry = self.entry(runner, TaskRegistry().add(calls, fixed_rate="1h", name="job"))
        asked = T0 - SECOND
        ScheduledTask.objects.filter(name="job").update(run_requested_at=asked)
        holder = DatabaseLockProvider(owner="b").lock(LockConfiguration("job", "1h"))
        runner.run(entry, RunRequest(requested_at=asked))
        self.assertEqual(calls.count, 0)
        self.assertEqual(ScheduledTask.objects.get(name="job").run_requested_at, asked)
        holder.unlock()
        runner.run(entry, RunRequest(requested_at=asked))
        self.assertEqual(calls.count, 1)
        self.assertIsNone(ScheduledTask.objects.get(name="job").run_requested_at)
        runner.run(entry, RunRequest(requested_at=asked))  # asked again by another poll
        self.assertEqual(calls.count, 1)


class LockedElsewhereTests(Base):
    def test_a_fire_time_whose_holder_died_unclaimed_still_runs(self):
        seen = []
        definition = TaskRegistry().add(
            lambda: seen.append(current_fire_time()), fixed_rate="1m", name="job"
        )
        clock = Clock(T0)
        runner = make_runner("b", clock)
        entry = self.entry(runner, definition)
        holder = DatabaseLockProvider(owner="a").lock(LockConfiguration("job", "1h"))
        retry = runner.run(entry, T0)
        self.assertEqual(retry, T0 + SECOND)  # not T0 + 1m: T0 may still be run
        holder.unlock()  # the holder ends without claiming T0
        clock.now = retry
        self.assertEqual(runner.run(entry, retry), T0 + timedelta(minutes=1))
        self.assertEqual(seen, [T0])

    def test_looking_again_never_asks_for_a_time_already_past(self):
        definition = TaskRegistry().add(Calls(), fixed_rate="1s", name="job")
        clock = Clock(T0)
        runner = make_runner("b", clock)
        entry = self.entry(runner, definition)
        DatabaseLockProvider(owner="a").lock(LockConfiguration("job", "1h"))
        clock.now = T0 + 3 * SECOND  # late, and T0 + 1 s is due too: both within the threshold
        retry = runner.run(entry, T0)
        self.assertEqual(retry, clock.now + SECOND)

    def test_a_fire_time_claimed_by_the_holder_is_looked_at_with_one_read(self):
        calls = Calls()
        definition = TaskRegistry().add(calls, fixed_rate="1m", name="job")
        clock = Clock(T0)
        a, b = make_runner("a", clock), make_runner("b", clock)
        entry_a, entry_b = self.entry(a, definition), self.entry(b, definition)
        holder = DatabaseLockProvider(owner="a").lock(LockConfiguration("job", "1h"))
        retry = b.run(entry_b, T0)
        holder.unlock()
        a.run(entry_a, T0)
        clock.now = retry
        with CaptureQueriesContext(connection) as queries:
            self.assertEqual(b.run(entry_b, retry), T0 + timedelta(minutes=1))
        statements = [q["sql"] for q in queries if not q["sql"].startswith("SET ")]
        self.assertEqual(len(statements), 1, statements)  # no lock taken: one read of the row
        self.assertIn("scheduledtask", statements[0])
        self.assertEqual(calls.count, 1)

    def test_a_lock_held_by_the_same_holder_for_longer_than_any_run_is_reported(self):
        definition = TaskRegistry().add(Calls(), fixed_rate="1m", name="job")
        clock = Clock(T0)
        runner = make_runner("b", clock)
        entry = self.entry(runner, definition)
        DatabaseLockProvider(owner="frozen").lock(LockConfiguration("job", "1h"))
        with self.assertNoLogs("django_scheduling.runtime.firing", "WARNING"):
            for minute in range(4):  # the holder is looked at after a minute, and again
                clock.now = T0 + timedelta(minutes=minute, seconds=10)
                runner.run(entry, clock.now)
        with self.assertLogs("django_scheduling.runtime.firing", "WARNING") as logs:
            clock.now = T0 + timedelta(minutes=4, seconds=10)
            runner.run(entry, clock.now)
        self.assertIn("held by frozen", logs.output[0])


class LockLostTests(Base):
    def test_a_run_whose_lock_was_taken_over_is_flagged_and_cannot_overwrite_the_newer_run(self):
        lost = []

        def on_lock_lost(sender, **kw):
            return lost.append(kw)

        signals.lock_lost.connect(on_lock_lost, weak=False)
        self.addCleanup(signals.lock_lost.disconnect, on_lock_lost)
        registry = TaskRegistry()
        clock = Clock(T0)
        stale = make_runner("a", clock)
        newer = make_runner("b", clock)

        def task():
            if current_fire_time() != T0:
                return
            # While "a" is frozen, its lock expires and "b" runs the next fire time.
            TaskLock.objects.filter(name="job").update(lock_until=utcnow() - SECOND)
            clock.now = T0 + 5 * SECOND
            newer.run(newer_entry, T0 + 5 * SECOND)

        definition = registry.add(task, fixed_delay="5s", name="job")
        stale_entry = self.entry(stale, definition)
        newer_entry = self.entry(newer, definition)
        with self.assertLogs("django_scheduling.runtime.firing", "WARNING") as logs:
            stale.run(stale_entry, T0)
        first, second = TaskRun.objects.order_by("started_at", "id")
        self.assertEqual((first.scheduled_at, first.lock_lost), (T0, True))
        self.assertEqual((second.scheduled_at, second.lock_lost), (T0 + 5 * SECOND, False))
        row = ScheduledTask.objects.get(name="job")
        self.assertEqual((row.last_fire_time, row.last_run_id), (T0 + 5 * SECOND, second.pk))
        self.assertTrue(any(f"Run {first.pk} of job" in line for line in logs.output))
        self.assertTrue(any(f"run {second.pk} may have overlapped" in line for line in logs.output))
        self.assertTrue(run_events.drain(10))  # the signals go out from the events thread
        self.assertEqual([(e["run"], e["other_run"]) for e in lost], [(first.pk, second.pk)])


class RecoveryTests(Base):
    def test_a_lost_run_of_a_recover_task_runs_again_once(self):
        seen = []
        registry = TaskRegistry()
        definition = registry.add(
            lambda: seen.append(current_fire_time()), fixed_rate="1h", name="job", recover=True
        )
        plain = registry.add(lambda: None, fixed_rate="1h", name="plain")
        runner = make_runner("b", Clock(T0))
        entry = self.entry(runner, definition)
        self.entry(runner, plain)
        # A run of each task whose process died: the lock expired without a finish.
        now = utcnow()
        for name in ("job", "plain"):
            TaskLock.objects.create(
                name=name, lock_until=now - SECOND, locked_at=now - 20 * SECOND, locked_by="dead"
            )
            TaskRun.objects.create(
                task_name=name,
                scheduled_at=T0 - timedelta(hours=1),
                started_at=now - 20 * SECOND,
                status=RunStatus.RUNNING,
                instance="dead",
                locked_at=now - 20 * SECOND,
            )
        lost = history.mark_lost_runs(now=now, using="default")
        self.assertEqual(len(lost), 2)
        tasks = {d.name: d for d in registry}
        self.assertEqual(request_recoveries(lost, tasks, using="default"), 1)
        job_row = ScheduledTask.objects.get(name="job")
        self.assertIsNone(ScheduledTask.objects.get(name="plain").recover_run_id)
        request = RunRequest(recover_run_id=job_row.recover_run_id)
        runner.run(entry, request)
        runner.run(entry, request)  # asked again: already recovered
        self.assertEqual(seen, [T0 - timedelta(hours=1)])
        recovery = TaskRun.objects.get(recovery_of=job_row.recover_run_id)
        self.assertEqual(recovery.status, RunStatus.SUCCEEDED)
        self.assertIsNone(ScheduledTask.objects.get(name="job").recover_run_id)
        # A recovery that is lost in turn is not recovered again.
        self.assertEqual(
            request_recoveries(
                [(recovery.pk, "job", job_row.recover_run_id)], tasks, using="default"
            ),
            0,
        )


class OutageTests(Base):
    def test_a_run_that_ends_during_an_outage_is_recorded_when_the_database_is_back(self):
        gone = table_gone(TaskRun)

        def task():
            gone.__enter__()

        runner = make_runner("a", Clock(T0))
        entry = self.entry(runner, TaskRegistry().add(task, fixed_rate="10s", name="job"))
        finished = []

        def on_run_succeeded(sender, **kw):
            return finished.append(sender)

        signals.run_succeeded.connect(on_run_succeeded, weak=False)
        self.addCleanup(signals.run_succeeded.disconnect, on_run_succeeded)
        skipped = []

        def on_run_skipped(sender, **kw):
            return skipped.append(kw["reason"])

        signals.run_skipped.connect(on_run_skipped, weak=False)
        self.addCleanup(signals.run_skipped.disconnect, on_run_skipped)
        try:
            with self.assertLogs("django_scheduling.runtime.writer", "ERROR") as logs:
                next_time = runner.run(entry, T0)
        finally:
            gone.__exit__(None, None, None)
        self.assertEqual(next_time, T0 + 10 * SECOND)  # the schedule goes on: it ran
        self.assertIn("1 run(s) ended but could not be recorded", logs.output[0])
        self.assertTrue(run_events.drain(10))  # the signals go out from the events thread
        self.assertEqual((finished, skipped), (["job"], []))
        self.assertEqual(TaskRun.objects.get().status, RunStatus.RUNNING)
        self.assertEqual(runner.outbox.flush(), 1)
        self.assertEqual(TaskRun.objects.get().status, RunStatus.SUCCEEDED)

    def test_a_lock_whose_release_failed_is_released_when_the_database_is_back(self):
        gone = table_gone(TaskLock)
        runner = make_runner("a", Clock(T0))
        entry = self.entry(runner, TaskRegistry().add(gone.__enter__, fixed_rate="1h", name="job"))
        runner.run(entry, T0)
        gone.__exit__(None, None, None)
        other = DatabaseLockProvider(owner="b")
        self.assertIsNone(other.lock(LockConfiguration("job", "1m")))  # still held by "a"
        self.assertEqual(runner.outbox.flush(), 1)
        self.assertIsNotNone(other.lock(LockConfiguration("job", "1m")))

    def test_an_unlocked_task_backs_off_while_the_database_is_down(self):
        calls = Calls()
        clock = Clock(T0)
        runner = make_runner("a", clock)
        entry = self.entry(runner, TaskRegistry().add(calls, fixed_rate="2s", lock=False, name="u"))
        retries = []
        with (
            table_gone(ScheduledTask),
            self.assertLogs("django_scheduling.runtime.firing", "ERROR"),
        ):
            for _ in range(4):
                retries.append(runner.run(entry, clock.now) - clock.now)
                clock.now += retries[-1]
        self.assertEqual(retries, [SECOND, 2 * SECOND, 4 * SECOND, 8 * SECOND])
        self.assertEqual(calls.count, 0)
        self.assertIsNotNone(runner.run(entry, clock.now))
        self.assertEqual(calls.count, 1)

    def test_a_batch_that_meets_an_outage_backs_off_with_a_log_line_per_wait(self):
        clock = Clock(T0)
        runner = make_runner("a", clock)
        registry = TaskRegistry()
        definitions = [registry.add(Calls(), fixed_rate="2s", name=f"job{i:02}") for i in range(20)]
        entries = [Entry(spec.name, spec) for spec in runner.specs(definitions, complete=False)]
        entries[0].payload.database_failures = 2  # failed twice already: backs off for 4 s
        with (
            table_gone(ScheduledTask),
            self.assertLogs("django_scheduling.runtime.firing", "ERROR") as logs,
        ):
            outcomes = runner.dispatch([(entry, T0) for entry in entries])
        self.assertEqual(outcomes, [T0 + 4 * SECOND] + [T0 + SECOND] * 19)
        # One line per wait, the longest last.
        self.assertEqual(len(logs.records), 2, logs.output)
        self.assertRegex(
            logs.records[0].getMessage(),
            r"(?s)^Not running 19 firings \(job01, job02, job03 and 16 more\): the database is "
            r"unavailable \(.+\); trying again in 1s$",
        )
        self.assertRegex(
            logs.records[1].getMessage(),
            rf"(?s)^Not running job00 \(scheduled for {re.escape(T0.isoformat())}\): the database "
            r"is unavailable \(.+\); trying again in 4s$",
        )

    def running_every_second(self):
        """Start a service with one task due every second; return its event and entry once it
        has run."""
        ran = threading.Event()
        registry = TaskRegistry()
        definition = registry.add(ran.set, fixed_rate="1s", name="job")
        service = SchedulerService([definition], tasks=registry)
        service.start()
        self.addCleanup(service.stop, 5)
        self.assertTrue(ran.wait(5))
        return ran, service.scheduler.entries()[0]

    @override_settings(SCHEDULING={"HOUSEKEEPING_INTERVAL": "1h"})
    def test_tasks_that_back_off_try_again_as_soon_as_the_database_answers(self):
        ran, entry = self.running_every_second()
        # A table the firings and the maintenance thread both read: the database "is down".
        with table_gone(ScheduledTask):
            poll(lambda: entry.payload.database_failures >= 4, timeout=30)  # backing off 8 s now
            ran.clear()
        back = utcnow()
        self.assertTrue(ran.wait(5), "the task did not run within 5 s of the database's return")
        self.assertLess(utcnow() - back, timedelta(seconds=4))

    @override_settings(SCHEDULING={"HOUSEKEEPING_INTERVAL": "1h"})
    def test_a_database_that_only_fails_the_firings_leaves_them_to_their_back_off(self):
        # Reads answer, the lock table does not (think of a read-only failover): the tasks
        # must not be woken every second.
        _ran, entry = self.running_every_second()
        with table_gone(TaskLock):
            poll(lambda: entry.payload.database_failures >= 3, timeout=30, interval=0.02)
            third = time.monotonic()
            poll(lambda: entry.payload.database_failures >= 4, timeout=30, interval=0.02)
            # The fourth attempt waited out the back-off after the third failure (4 s).
            self.assertGreater(time.monotonic() - third, 3.0)


class DeadHolderTests(TransactionTestCase):
    def test_locks_of_dead_processes_of_this_host_are_freed(self):
        child = subprocess.Popen(["true"])
        child.wait()
        now = utcnow()
        dead, alive = identity(child.pid), identity()
        # A pid in use again, by a process that started later than the lock's holder.
        host, pid, start = alive.rsplit(":", 2)
        reused = f"{host}:{pid}:{int(start) - 3600}"
        for name, owner in (
            ("dead", dead),
            ("alive", alive),
            ("reused", reused),
            ("elsewhere", "other-host:1:1"),
            # Same host name, another pid namespace (containers on the host's network).
            ("other-namespace", f"{socket.gethostname()}@1:1:1"),
            ("custom", "web-1"),
        ):
            TaskLock.objects.create(
                name=name, lock_until=now + timedelta(hours=1), locked_at=now, locked_by=owner
            )
        freed = free_locks_of_dead_processes(using="default")
        self.assertEqual(sorted(freed), ["dead", "reused"])
        free = DatabaseLockProvider(owner="me")
        self.assertIsNotNone(free.lock(LockConfiguration("dead", "1m")))
        self.assertIsNone(free.lock(LockConfiguration("alive", "1m")))
        self.assertIsNone(free.lock(LockConfiguration("elsewhere", "1m")))

    def test_each_holder_is_judged_once_however_many_locks_it_holds(self):
        # Every housekeeping pass looks at the locks held by processes of this host; a
        # scheduler of 10,000 tasks holds thousands at any moment, and judging each lock's
        # holder (a signal and two reads of /proc) took about 30 us a lock, on the thread
        # that also beats the heartbeat.
        child = subprocess.Popen(["true"])
        child.wait()
        now = utcnow()
        dead, alive = identity(child.pid), identity()
        for index in range(5):
            for owner in (dead, alive):
                TaskLock.objects.create(
                    name=f"{owner}-{index}",
                    lock_until=now + timedelta(hours=1),
                    locked_at=now,
                    locked_by=owner,
                )
        judged = []

        def is_dead_local(owner):
            judged.append(owner)
            return real(owner)

        real = process.is_dead_local
        with mock.patch.object(process, "is_dead_local", is_dead_local):
            freed = free_locks_of_dead_processes(using="default")
        self.assertEqual(sorted(judged), sorted([dead, alive]))
        self.assertEqual(sorted(freed), [f"{dead}-{index}" for index in range(5)])
        still_held = TaskLock.objects.filter(lock_until__gt=utcnow())
        self.assertEqual(
            sorted(still_held.values_list("name", flat=True)),
            [f"{alive}-{index}" for index in range(5)],
        )

    def test_a_dead_process_s_many_locks_are_freed_a_chunk_at_a_time(self):
        # A killed scheduler of thousands of tasks leaves thousands of locks: freed one
        # statement and one warning each, they held up its successor's start for seconds.
        child = subprocess.Popen(["true"])
        child.wait()
        now = utcnow()
        dead = identity(child.pid)
        names = [f"task-{index:04d}" for index in range(2 * maintenance.FREE_CHUNK + 1)]
        TaskLock.objects.bulk_create(
            [
                TaskLock(
                    name=name, lock_until=now + timedelta(hours=1), locked_at=now, locked_by=dead
                )
                for name in names
            ],
            batch_size=200,
        )
        with (
            CaptureQueriesContext(connection) as queries,
            self.assertLogs(maintenance.logger, "WARNING") as logs,
        ):
            freed = free_locks_of_dead_processes(using="default")
        self.assertEqual(sorted(freed), names)
        updates = [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
        self.assertEqual(len(updates), 3)
        self.assertEqual(len(logs.output), 1)
        self.assertIn(f"Freed {len(names)} lock(s) held by {dead}, which has died", logs.output[0])
        self.assertIn("and 991 more", logs.output[0])
        self.assertFalse(TaskLock.objects.filter(lock_until__gt=utcnow()).exists())

    def test_a_lock_that_changed_since_it_was_read_is_left_alone(self):
        # Between the read of a dead holder's locks and the statement that frees them, one
        # may expire and another be taken by a live process: neither is touched or reported.
        child = subprocess.Popen(["true"])
        child.wait()
        now = utcnow()
        dead = identity(child.pid)
        rows = {
            "held": (now + timedelta(hours=1), now, dead),
            "expired": (now - timedelta(seconds=1), now - timedelta(hours=1), dead),
            "taken": (now + timedelta(hours=1), now, "web-2"),
        }
        for name, (until, at, owner) in rows.items():
            TaskLock.objects.create(name=name, lock_until=until, locked_at=at, locked_by=owner)
        freed = maintenance._free("default", dead, ["expired", "held", "taken"])
        self.assertEqual(freed, ["held"])
        for name in ("expired", "taken"):
            lock = TaskLock.objects.get(name=name)
            self.assertEqual((lock.lock_until, lock.locked_at, lock.locked_by), rows[name], name)
        held = TaskLock.objects.get(name="held")
        self.assertEqual(held.lock_until, held.locked_at)

    @pytest.mark.vendor("mysql")
    def test_a_dead_process_s_lock_is_freed_whatever_the_session_time_zone(self):
        # CURRENT_TIMESTAMP (Django's Now()) is in the session's time zone; locks are UTC.
        child = subprocess.Popen(["true"])
        child.wait()
        now = utcnow()
        TaskLock.objects.create(
            name="dead",
            lock_until=now + timedelta(hours=1),
            locked_at=now,
            locked_by=identity(child.pid),
        )
        with connection.cursor() as cursor:
            cursor.execute("SET time_zone = '+02:00'")
        try:
            freed = free_locks_of_dead_processes(using="default")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET time_zone = DEFAULT")
        self.assertEqual(freed, ["dead"])


class ThreadTests(TransactionTestCase):
    def test_the_maintenance_passes_keep_their_connection(self):
        # Under the default CONN_MAX_AGE = 0 each pass connected anew, once a second (on
        # PostgreSQL a new server process each time), as the claims and the writer no longer do.
        from django.db.backends.signals import connection_created

        from django_scheduling.conf import get_settings
        from django_scheduling.runtime.maintenance import Maintenance
        from django_scheduling.runtime.outbox import Outbox

        maintenance = Maintenance(
            conf=get_settings(), scheduler=NoScheduler(), pipeline=None, outbox=Outbox(), tasks={}
        )
        created = []

        def note(sender, connection, **kwargs):
            if threading.current_thread() is thread:
                created.append(connection.alias)

        connection_created.connect(note)
        self.addCleanup(connection_created.disconnect, note)
        passes = []

        def three_passes():
            try:
                for second in (1.0, 2.0, 3.0):
                    maintenance.tick(monotonic=second)
                    passes.append(maintenance.last_pass)
            finally:
                from django.db import connections

                connections.close_all()

        thread = threading.Thread(target=three_passes)
        thread.start()
        thread.join(30)
        self.assertEqual(len(passes), 3)
        self.assertEqual(created, ["default"])

    @pytest.mark.vendor("sqlite")
    def test_a_scheduler_thread_s_sqlite_connection_keeps_a_small_page_cache(self):
        # SQLite's default cache (2,000 KiB) filled up on each scheduler connection with
        # 10,000 tasks; a task's own connection (a worker thread's) keeps the project's.
        from django.db import connections

        from django_scheduling.storage.connections import SQLITE_CACHE_KIB, KeptConnection

        kept = KeptConnection("default")
        sizes = []

        def cache_size():
            with connections["default"].cursor() as cursor:
                cursor.execute("PRAGMA cache_size")
                return cursor.fetchone()[0]

        def set_cache(value):
            with connections["default"].cursor() as cursor:
                cursor.execute(f"PRAGMA cache_size = {value}")

        def use():
            with kept.use():
                ScheduledTask.objects.exists()
            sizes.append(cache_size())

        def uses():
            try:
                sizes.append(cache_size())  # a connection that is not the scheduler's
                set_cache(-100)  # smaller, as a project's init_command may make it: kept
                use()
                connections["default"].close()
                set_cache(1000)  # in pages (4 KiB each): capped
                use()
                use()  # the same connection again
                connections["default"].close()  # the thread reconnects
                use()
            finally:
                connections.close_all()

        thread = threading.Thread(target=uses)
        thread.start()
        thread.join(30)
        small = -SQLITE_CACHE_KIB
        self.assertEqual(len(sizes), 5)
        self.assertNotEqual(sizes[0], small)
        self.assertEqual(sizes[1:], [-100, small, small, small])

    @override_settings(SCHEDULING={"HOUSEKEEPING_INTERVAL": "1h"})
    def test_a_slow_maintenance_write_does_not_delay_lock_extensions(self):
        started, release, stuck = threading.Event(), threading.Event(), threading.Event()
        self.addCleanup(release.set)

        def long_task():
            started.set()
            release.wait(30)

        registry = TaskRegistry()
        definition = registry.add(long_task, fixed_rate="1h", lock_at_most_for="600ms", name="job")
        service = SchedulerService([definition], tasks=registry)
        service.start()
        self.addCleanup(service.stop, 5)
        self.addCleanup(stuck.set)  # before the stop
        self.assertTrue(started.wait(10))
        # A pending write that takes its time holds up the maintenance thread...
        service.outbox.add("a slow write", lambda: stuck.wait(30))
        first_expiry = TaskLock.objects.get(name="job").lock_until
        # ... and the lock is still extended past its first expiry, and past the next.
        poll(lambda: TaskLock.objects.get(name="job").lock_until > first_expiry + SECOND, 10)
        self.assertEqual(len(service.outbox), 1)  # the slow write is still under way
        release.set()

    def test_the_first_housekeeping_pass_comes_at_start(self):
        from django_scheduling.conf import get_settings
        from django_scheduling.runtime.maintenance import Maintenance
        from django_scheduling.runtime.outbox import Outbox

        now = utcnow()
        TaskLock.objects.create(
            name="dead", lock_until=now - SECOND, locked_at=now - 10 * SECOND, locked_by="x"
        )
        lost = TaskRun.objects.create(
            task_name="dead",
            started_at=now - 10 * SECOND,
            status=RunStatus.RUNNING,
            instance="x",
            locked_at=now - 10 * SECOND,
        )

        maintenance = Maintenance(
            conf=get_settings(), scheduler=NoScheduler(), pipeline=None, outbox=Outbox(), tasks={}
        )
        maintenance.tick(monotonic=1.0)  # a second after the machine booted
        lost.refresh_from_db()
        self.assertEqual(lost.status, RunStatus.LOST)
