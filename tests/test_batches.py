"""Firings claimed in batches: the runner's ``run_batch``, the batch statements of the lock
provider, the task rows and the history, and the writer that records ends and releases locks.

Real database, real lock provider; two runners with different instance names stand for two
instances. Their clocks are injected; the locks use the database's clock, as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
import weakref
from datetime import UTC, datetime, timedelta
from unittest import mock
from zoneinfo import ZoneInfo

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.db.backends.signals import connection_created
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext
from django.utils import timezone, translation

from django_scheduling import signals
from django_scheduling.conf import get_settings
from django_scheduling.locking import (
    BaseLockProvider,
    DatabaseLockProvider,
    Lock,
    LockConfiguration,
    LockError,
)
from django_scheduling.models import RunStatus, ScheduledTask, TaskLock, TaskRun
from django_scheduling.observability.events import run_events
from django_scheduling.runtime import delay_queue
from django_scheduling.runtime.calls import Call, Entry
from django_scheduling.runtime.claim_queue import CLAIM_THREADS
from django_scheduling.runtime.firing import FiringPipeline
from django_scheduling.runtime.firing.contention import LOCKED_RECHECK
from django_scheduling.runtime.keepalive import KeepAlive
from django_scheduling.runtime.outbox import Outbox
from django_scheduling.runtime.service import SchedulerService
from django_scheduling.runtime.writer import EndWriter
from django_scheduling.storage import batch_rows
from django_scheduling.storage.sql import array_literal
from django_scheduling.tasks.registry import TaskRegistry

from .test_execution import database_now, poll_until

T0 = datetime(2026, 5, 13, 12, 0, 0, tzinfo=UTC)
DEADLINE = 30.0
CONTROL = ("BEGIN", "COMMIT", "SET LOCAL", "SET SESSION", "SAVEPOINT", "RELEASE SAVEPOINT")


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


@contextlib.contextmanager
def sent_statements():
    """Collect the SQL texts (with their placeholders) sent on this thread's connection."""
    sent: list[str] = []

    def collect(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(collect):
        yield sent


class TickingClock(Clock):
    """A clock that moves on a microsecond at each reading."""

    def __call__(self) -> datetime:
        now = self.now
        self.now += timedelta(microseconds=1)
        return now


class Counter:
    def __init__(self, error: Exception | None = None) -> None:
        self.count = 0
        self.error = error
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.count += 1
        if self.error is not None:
            raise self.error


class Instance:
    """A runner with its writer, as one scheduler process has them."""

    def __init__(self, name: str, clock: Clock, *, history: bool = True) -> None:
        conf = dataclasses.replace(get_settings(), instance_name=name, history=history)
        provider = DatabaseLockProvider(owner=name)
        self.outbox = Outbox()
        self.writer = EndWriter(
            using=conf.database, provider=provider, outbox=self.outbox, name=f"writer-{name}"
        )
        self.runner = FiringPipeline(
            conf=conf,
            provider=provider,
            default_zone=UTC,
            clock=clock,
            outbox=self.outbox,
            writer=self.writer,
        )
        self.writer.start()
        self.next_times: dict[str, datetime | None] = {}

    def entries(self, definitions) -> list[Entry]:
        return [Entry(s.name, s) for s in self.runner.specs(definitions, complete=False)]

    def batch(self, entries: list[Entry], firing: datetime):
        return self.runner.dispatch([(entry, firing) for entry in entries])

    def run_calls(self, entries: list[Entry], outcomes) -> int:
        """Run the calls among *outcomes* as the pool would, and wait until the writer has
        recorded their ends; return how many ran."""
        calls = [
            (entry, outcome)
            for entry, outcome in zip(entries, outcomes, strict=True)
            if isinstance(outcome, Call)
        ]
        for entry, call in calls:
            call.entry = entry
            call.run(
                lambda call, next_time: self.next_times.__setitem__(call.entry.name, next_time)
            )
        assert self.writer.drain(DEADLINE), "the writer did not record the ends in time"
        return len(calls)

    def stop(self) -> None:
        self.writer.stop(timeout=DEADLINE)


class Instances(TransactionTestCase):
    """Tests with instances (see ``Instance``) made by ``instance()`` and stopped after."""

    def setUp(self) -> None:
        self.registry = TaskRegistry()
        self.clock = Clock(T0)
        self.instances: list[Instance] = []

    def tearDown(self) -> None:
        for instance in self.instances:
            instance.stop()

    def instance(self, name: str, **options) -> Instance:
        instance = Instance(name, self.clock, **options)
        self.instances.append(instance)
        return instance

    def tasks(self, count: int, **options):
        """Declare *count* tasks (``job000``, ...) that count their calls; return their
        definitions and counters."""
        options.setdefault("fixed_rate", "10s")
        counters = [Counter() for _ in range(count)]
        definitions = [
            self.registry.add(counter, name=f"job{i:03}", **options)
            for i, counter in enumerate(counters)
        ]
        return definitions, counters


class BatchTests(Instances):
    def test_a_run_whose_lock_was_taken_over_while_it_ran_is_recorded_lock_lost(self):
        definitions, counters = self.tasks(2)
        a = self.instance("a")
        entries = a.entries(definitions)
        outcomes = a.batch(entries, T0)
        # The lock of job000 expired and another instance took it: the keep-alive's next
        # extension of the batch's locks finds it lost.
        TaskLock.objects.filter(name="job000").update(
            locked_by="b", locked_at=datetime.now(UTC) + timedelta(seconds=1)
        )
        outcomes[0].locks.extend()
        self.assertEqual([run.lost for run in outcomes], [True, False])
        self.assertEqual(a.run_calls(entries, outcomes), 2)
        self.assertEqual([c.count for c in counters], [1, 1])
        runs = TaskRun.objects.order_by("task_name")
        self.assertEqual(
            [(r.task_name, r.lock_lost) for r in runs], [("job000", True), ("job001", False)]
        )
        self.assertEqual(TaskLock.objects.get(name="job000").locked_by, "b")  # not released

    def lost_signals(self) -> list[dict]:
        lost: list[dict] = []

        def on_lock_lost(sender, **kwargs):
            lost.append(kwargs)

        signals.lock_lost.connect(on_lock_lost, weak=False)
        self.addCleanup(signals.lock_lost.disconnect, on_lock_lost)
        return lost

    def test_a_lock_taken_over_is_found_lost_by_its_release_by_name(self):
        # No extension came: the batch still held the lock by its name when the run ended, and
        # the writer's release through the batch's handle finds it taken.
        definitions, _ = self.tasks(2)
        a = self.instance("a")
        lost = self.lost_signals()
        entries = a.entries(definitions)
        outcomes = a.batch(entries, T0)
        TaskLock.objects.filter(name="job000").update(
            locked_by="b", locked_at=datetime.now(UTC) + timedelta(seconds=1)
        )
        self.assertEqual(a.run_calls(entries, outcomes), 2)
        runs = TaskRun.objects.order_by("task_name")
        self.assertEqual(
            [(r.task_name, r.lock_lost) for r in runs], [("job000", True), ("job001", False)]
        )
        self.assertTrue(run_events.drain(DEADLINE))  # the signals go out from the events thread
        self.assertEqual([item["task"].name for item in lost], ["job000"])  # reported once
        self.assertEqual(TaskLock.objects.get(name="job000").locked_by, "b")  # not released

    def test_a_lock_found_lost_by_the_release_at_shutdown_is_reported_when_the_run_ends(self):
        # At a shutdown the locks of the runs under way are released at once; a lock taken
        # over by then is reported as lost when its run ends.
        a = self.instance("a")
        lost = self.lost_signals()

        def shuts_down_while_it_runs() -> None:
            TaskLock.objects.filter(name="job000").update(
                locked_by="b", locked_at=datetime.now(UTC) + timedelta(seconds=1)
            )
            a.runner.interrupted(["job000"])

        definition = self.registry.add(shuts_down_while_it_runs, name="job000", fixed_rate="10s")
        entries = a.entries([definition])
        self.assertEqual(a.run_calls(entries, a.batch(entries, T0)), 1)
        self.assertTrue(TaskRun.objects.get().lock_lost)
        self.assertTrue(run_events.drain(DEADLINE))
        self.assertEqual([item["task"].name for item in lost], ["job000"])
        self.assertEqual(TaskLock.objects.get(name="job000").locked_by, "b")

    def test_a_batch_runs_each_due_firing_once_and_records_it(self):
        definitions, counters = self.tasks(5)
        a = self.instance("a")
        entries = a.entries(definitions)
        self.assertEqual(a.run_calls(entries, a.batch(entries, T0)), 5)
        self.assertEqual([c.count for c in counters], [1] * 5)
        runs = TaskRun.objects.order_by("task_name")
        self.assertEqual(
            [(r.task_name, r.status, r.scheduled_at, r.instance) for r in runs],
            [(f"job{i:03}", RunStatus.SUCCEEDED, T0, "a") for i in range(5)],
        )
        self.assertTrue(all(r.finished_at is not None and r.duration is not None for r in runs))
        for row in ScheduledTask.objects.all():
            self.assertEqual(row.last_fire_time, T0)
            self.assertEqual(row.last_run_id, runs.get(task_name=row.name).pk)
            self.assertEqual(row.next_fire_time, T0 + timedelta(seconds=10))
        # Every lock is released, and another instance could take it now.
        for lock in TaskLock.objects.all():
            self.assertEqual(lock.locked_by, "a")
            self.assertLessEqual(lock.lock_until, datetime.now(UTC))
        self.assertEqual(set(a.next_times.values()), {T0 + timedelta(seconds=10)})

    def test_claimed_firings_keep_their_locks_alive_until_they_start(self):
        # Claimed together, their locks wait under one keep-alive record; a wait longer than
        # half of lock_at_most_for (a burst claimed ahead, a queue behind long runs) extends them.
        # 2 s: the extension comes at half of it, with 1 s of margin on a loaded machine.
        definitions, counters = self.tasks(3, lock_at_most_for="2s")
        a = self.instance("a")
        a.runner.keepalive = KeepAlive()
        a.runner.keepalive.start()
        self.addCleanup(a.runner.keepalive.stop)
        entries = a.entries(definitions)
        outcomes = a.batch(entries, T0)
        first_expiry = max(lock.lock_until for lock in TaskLock.objects.all())
        poll_until(lambda: database_now() > first_expiry + timedelta(milliseconds=100))
        other = DatabaseLockProvider(owner="b")
        for definition in definitions:
            self.assertIsNone(other.lock(LockConfiguration(definition.name, "1m")))
        self.assertEqual(a.run_calls(entries, outcomes), 3)
        self.assertEqual([c.count for c in counters], [1] * 3)
        runs = TaskRun.objects.all()
        self.assertEqual({(r.status, r.lock_lost) for r in runs}, {(RunStatus.SUCCEEDED, False)})
        self.assertEqual(len(a.runner.keepalive), 0)  # nothing left to extend
        for definition in definitions:
            lock = other.lock(LockConfiguration(definition.name, "1m"))
            self.assertIsNotNone(lock)  # released at the end
            lock.unlock()

    def test_the_writer_keeps_no_ended_run_once_it_is_written(self):
        # Kept while the thread waited for the next ends, a burst of 10,000 stayed in memory
        # until the next burst.
        class Done:
            def __call__(self, call, next_time: datetime | None) -> None:
                pass

        definitions, _ = self.tasks(5)
        a = self.instance("a")
        entries = a.entries(definitions)
        watched = []
        for outcome in a.batch(entries, T0):
            done = Done()
            watched.append(weakref.ref(done))
            outcome.run(done)
        del done
        self.assertTrue(a.writer.drain(DEADLINE))
        self.assertEqual(TaskRun.objects.filter(status=RunStatus.SUCCEEDED).count(), 5)
        self.assertEqual([ref() for ref in watched], [None] * 5)

    def test_a_batch_claimed_ahead_is_decided_and_recorded_as_at_its_instant(self):
        definitions, counters = self.tasks(5)
        a = self.instance("a")
        entries = a.entries(definitions)
        self.clock.now = T0 - timedelta(milliseconds=700)  # the burst is taken ahead
        outcomes = a.batch(entries, T0)
        self.assertTrue(all(isinstance(o, Call) and o.at == T0 for o in outcomes), outcomes)
        self.assertEqual([c.count for c in counters], [0] * 5)  # claimed, not run
        runs = TaskRun.objects.all()
        self.assertEqual(
            {(r.status, r.scheduled_at, r.started_at) for r in runs}, {(RunStatus.RUNNING, T0, T0)}
        )
        self.assertEqual(set(ScheduledTask.objects.values_list("last_fire_time", flat=True)), {T0})
        self.clock.now = T0
        self.assertEqual(a.run_calls(entries, outcomes), 5)
        self.assertEqual(set(a.next_times.values()), {T0 + timedelta(seconds=10)})
        # Claimed at the time itself, a firing starts at once.
        self.clock.now = T0 + timedelta(seconds=10)
        outcomes = a.batch(entries, T0 + timedelta(seconds=10))
        self.assertEqual({o.at for o in outcomes}, {None})
        a.run_calls(entries, outcomes)

    def test_two_instances_batching_the_same_firings_run_each_once(self):
        definitions, counters = self.tasks(30)
        a, b = self.instance("a"), self.instance("b")
        entries = {"a": a.entries(definitions), "b": b.entries(definitions)}
        outcomes: dict[str, list] = {}
        start = threading.Barrier(2)

        def claim(name: str, instance: Instance) -> None:
            start.wait(DEADLINE)
            try:
                outcomes[name] = instance.batch(entries[name], T0)
            finally:
                connection.close()

        threads = [threading.Thread(target=claim, args=item) for item in (("a", a), ("b", b))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
        ran = a.run_calls(entries["a"], outcomes["a"]) + b.run_calls(entries["b"], outcomes["b"])
        self.assertEqual(ran, 30)
        self.assertEqual([c.count for c in counters], [1] * 30)
        self.assertEqual(TaskRun.objects.filter(status=RunStatus.SUCCEEDED).count(), 30)
        self.assertFalse(TaskRun.objects.exclude(status=RunStatus.SUCCEEDED).exists())

    def test_a_firing_another_instance_has_costs_one_statement_for_the_whole_batch(self):
        definitions, counters = self.tasks(40)
        a, b = self.instance("a"), self.instance("b")
        entries_a, entries_b = a.entries(definitions), b.entries(definitions)
        a.run_calls(entries_a, a.batch(entries_a, T0))
        with CaptureQueriesContext(connection) as queries:
            outcomes = b.batch(entries_b, T0)
        self.assertEqual(len(queries), 1, [q["sql"][:120] for q in queries])
        self.assertEqual(outcomes, [T0 + timedelta(seconds=10)] * 40)
        self.assertEqual([c.count for c in counters], [1] * 40)
        self.assertFalse(TaskRun.objects.filter(instance="b").exists())

    def test_a_burst_locked_or_run_elsewhere_asks_each_shared_trigger_once(self):
        # With several instances, most firings of a burst meet locks held elsewhere, then find
        # their fire times claimed: the tasks on one trigger, in one state, get their next fire
        # time once for the whole batch, as many tasks costing what one does. The clock moves
        # on at each reading, as a real one: a reading per firing would share nothing.
        self.clock = TickingClock(T0)

        def trigger_calls(count: int) -> int:
            names = [f"job{i:03}" for i in range(count)]
            TaskLock.objects.all().delete()
            ScheduledTask.objects.all().delete()
            other = DatabaseLockProvider(owner="x")
            held = [other.lock(LockConfiguration(name, "1m")) for name in names]
            b = self.instance(f"b{count}")
            entries = b.entries(definitions[:count])
            trigger = entries[0].payload.task.trigger
            cls = type(trigger)
            self.assertTrue(all(e.payload.task.trigger is trigger for e in entries))
            calls = []
            original = cls.next_fire_time

            def counted(self, **kwargs):
                calls.append(kwargs["now"])
                return original(self, **kwargs)

            # The first fire time (the rows' anchor is a reading of the clock).
            due = b.runner.first_fire_time(entries[0], now=self.clock())
            self.assertEqual({b.runner.first_fire_time(e, now=due) for e in entries}, {due})
            with mock.patch.object(cls, "next_fire_time", counted):
                locked = b.batch(entries, due)
                # The holder claims the fire time and lets go: looked at again, it is settled.
                ScheduledTask.objects.filter(name__in=names).update(last_fire_time=due)
                for lock in held:
                    lock.unlock()
                settled = b.batch(entries, locked[0])
            # Looked at again within the misfire threshold (its holder may die first), all
            # from one reading of the clock; then on from the fire time run elsewhere.
            self.assertEqual(len(set(locked)), 1)
            self.assertTrue(due + LOCKED_RECHECK <= locked[0] < due + 2 * LOCKED_RECHECK)
            self.assertEqual(settled, [due + timedelta(seconds=10)] * count)
            self.assertFalse(TaskRun.objects.exists())
            return len(calls)

        definitions, counters = self.tasks(20)
        one = trigger_calls(1)
        self.assertGreater(one, 0)
        self.assertEqual(trigger_calls(20), one)
        self.assertEqual([c.count for c in counters], [0] * 20)

    @pytest.mark.vendor("postgresql", "sqlite")
    def test_a_claim_sends_the_same_statements_whatever_the_size_of_its_batch(self):
        # A batch's rows go as one parameter (arrays, JSON): a driver that keeps statements
        # prepared (SQLite's, per connection) keeps one per statement, not one per batch size.
        definitions, _ = self.tasks(10)
        unlocked = [
            self.registry.add(Counter(), name=f"free{i:03}", fixed_rate="10s", lock=False)
            for i in range(10)
        ]
        a = self.instance("a")
        entries = a.entries(definitions + unlocked)

        def statements(batch: list[Entry]) -> set[str]:
            with sent_statements() as sent:
                outcomes = a.batch(batch, T0)
            self.assertEqual(a.run_calls(batch, outcomes), len(batch))
            return {sql for sql in sent if not sql.startswith(CONTROL)}

        small = statements(entries[:3] + entries[10:13])
        large = statements(entries[3:10] + entries[13:20])
        self.assertEqual(small, large)
        # Each kind of write was made: the locks' rows, the runs' starts, the claims and the
        # notes of the runs of tasks with lock=False.
        self.assertEqual(TaskLock.objects.count(), 10)
        self.assertEqual(TaskRun.objects.filter(status=RunStatus.SUCCEEDED).count(), 20)
        claimed = ScheduledTask.objects.filter(name__startswith="job", last_fire_time=T0)
        self.assertEqual(claimed.count(), 10)
        noted = ScheduledTask.objects.filter(name__startswith="free", last_run__isnull=False)
        self.assertEqual(noted.count(), 10)

    @pytest.mark.vendor("mysql")
    def test_mariadb_records_the_runs_of_any_batch_with_the_same_statements(self):
        # From MariaDB 10.6 the runs' starts and ends go as one JSON text (JSON_TABLE), not a
        # parameter per value that MySQLdb escapes one by one; before it, a placeholder per
        # value, with the same rows written.
        if not (connection.mysql_is_mariadb and connection.mysql_version >= (10, 6)):
            self.skipTest("JSON_TABLE is read on MariaDB 10.6 or later only")
        definitions, counters = self.tasks(10)
        older = mock.patch.object(connection, "mysql_version", (10, 5, 99))
        for number, (label, patch) in enumerate(
            {"10.6 or later": contextlib.nullcontext(), "10.5": older}.items()
        ):
            with self.subTest(label), patch:
                for model in (TaskRun, ScheduledTask, TaskLock):
                    model.objects.all().delete()
                a = self.instance(f"a{number}")
                a.stop()  # its ends are written on this thread, where they are seen
                entries = a.entries(definitions)

                def runs_statements(a: Instance, batch: list[Entry]) -> set[str]:
                    """The texts of the statements that wrote the runs of *batch*."""
                    with sent_statements() as sent:
                        self.assertEqual(a.run_calls(batch, a.batch(batch, T0)), len(batch))
                    table = connection.ops.quote_name(TaskRun._meta.db_table)
                    writes = (f"INSERT INTO {table}", f"UPDATE {table}")
                    return {sql for sql in sent if sql.startswith(writes)}

                small = runs_statements(a, entries[:3])
                large = runs_statements(a, entries[3:10])
                json_table = {sql for sql in small | large if "JSON_TABLE(%s" in sql}
                if number == 0:
                    self.assertEqual(small, large)
                    self.assertEqual(len(json_table), 2)  # the starts and the ends
                else:
                    self.assertNotEqual(small, large)
                    self.assertEqual(json_table, set())
                self.assertEqual([c.count for c in counters], [number + 1] * 10)
                runs = TaskRun.objects.filter(instance=f"a{number}")
                self.assertEqual(
                    sorted(runs.values_list("task_name", "status", "scheduled_at", "started_at")),
                    sorted((d.name, RunStatus.SUCCEEDED, T0, T0) for d in definitions),
                )
                for run in runs:
                    self.assertEqual(run.duration, run.finished_at - run.started_at)
                    # Values and JSON nulls alike: locked, no timeout, no recovery.
                    self.assertIsNotNone(run.locked_at)
                    self.assertIsNone(run.timeout_at)
                    self.assertIsNone(run.recovery_of_id)

    @pytest.mark.vendor("sqlite")
    def test_an_older_sqlite_claims_with_a_placeholder_per_value(self):
        # Without JSON, or before 3.35 (no RETURNING, no UPDATE ... FROM): the statements of
        # MySQL, with the same rows written.
        definitions, counters = self.tasks(4)
        unlocked = Counter()
        free = self.registry.add(unlocked, name="free", fixed_rate="10s", lock=False)
        features = connection.features
        older = {
            "without JSON": mock.patch.dict(features.__dict__, {"supports_json_field": False}),
            "before 3.35": mock.patch.object(
                type(features), "can_return_rows_from_bulk_insert", False
            ),
        }
        for number, (label, patch) in enumerate(older.items()):
            with self.subTest(label):
                for model in (TaskRun, ScheduledTask, TaskLock):
                    model.objects.all().delete()
                a = self.instance(f"a{number}")
                entries = a.entries([*definitions, free])
                with patch, sent_statements() as sent:
                    self.assertEqual(a.run_calls(entries, a.batch(entries, T0)), 5)
                self.assertFalse([sql for sql in sent if "json_each(%s)) AS v" in sql])
                self.assertEqual([c.count for c in [*counters, unlocked]], [number + 1] * 5)
                runs = TaskRun.objects.filter(status=RunStatus.SUCCEEDED, instance=f"a{number}")
                self.assertEqual(
                    sorted(runs.values_list("task_name", "scheduled_at", "started_at")),
                    sorted((d.name, T0, T0) for d in [*definitions, free]),
                )
                rows = ScheduledTask.objects.order_by("name")
                self.assertEqual(
                    list(rows.values_list("name", "next_fire_time")),
                    sorted((d.name, T0 + timedelta(seconds=10)) for d in [*definitions, free]),
                )
                self.assertTrue(all(row.last_run_id for row in rows))
                self.assertEqual(rows.filter(last_fire_time=T0).count(), 4)
                self.assertEqual(TaskLock.objects.filter(locked_by=f"a{number}").count(), 4)

    def test_a_firing_run_elsewhere_is_logged_with_its_fire_time_at_debug_level(self):
        definitions, _ = self.tasks(2)
        a, b = self.instance("a"), self.instance("b")
        entries_a, entries_b = a.entries(definitions), b.entries(definitions)
        a.run_calls(entries_a, a.batch(entries_a, T0))
        with self.assertLogs("django_scheduling.runtime.firing.contention", "DEBUG") as logs:
            b.batch(entries_b, T0)
        self.assertEqual(
            logs.output,
            [
                f"DEBUG:django_scheduling.runtime.firing.contention:Skipped job00{i} at "
                f"{T0.isoformat()}: already run"
                for i in range(2)
            ],
        )

    def test_the_statements_of_a_batch_do_not_grow_with_its_size(self):
        counts = []
        for size, prefix in ((5, "small"), (60, "large")):
            definitions = [
                self.registry.add(Counter(), name=f"{prefix}{i:03}", fixed_rate="10s")
                for i in range(size)
            ]
            a = self.instance(f"a-{prefix}")
            entries = a.entries(definitions)
            # The first firing creates the lock rows; the second is the steady state.
            a.run_calls(entries, a.batch(entries, T0))
            self.clock.now = T0 + timedelta(seconds=10)
            with CaptureQueriesContext(connection) as queries:
                outcomes = a.batch(entries, T0 + timedelta(seconds=10))
            self.assertTrue(all(isinstance(o, Call) for o in outcomes))
            # Transaction control (BEGIN, COMMIT, PostgreSQL's SET LOCAL) aside.
            statements = [q["sql"] for q in queries if not q["sql"].startswith(CONTROL)]
            counts.append(len(statements))
            a.run_calls(entries, outcomes)
            self.clock.now = T0
        self.assertEqual(counts[0], counts[1])
        # Read, lock, record the runs, claim (MySQL adds the read of the runs' ids).
        self.assertLessEqual(counts[1], 5, statements)

    @pytest.mark.vendor("sqlite", "postgresql")  # mysqlclient keeps no statement prepared
    def test_the_writer_sends_the_same_statements_for_batches_of_any_size(self):
        # SQLite's driver keeps each connection's last 128 statement texts prepared, each as
        # large as its parameters; psycopg converts each text once. A text per batch size
        # made a scheduler's memory grow as long as it ran.
        texts = []
        for count in (3, 7):
            definitions = [
                self.registry.add(Counter(), name=f"size{count}-{i}", fixed_rate="10s")
                for i in range(count)
            ]
            a = self.instance(f"a{count}")
            entries = a.entries(definitions)
            outcomes = a.batch(entries, T0)
            ended: list = []
            a.writer.add = ended.append  # the ends of the batch, written together below
            for outcome in outcomes:
                outcome.run(lambda call, next_time: None)
            seen: set[str] = set()

            def note(execute, sql, params, many, context, seen=seen):
                seen.add(sql)
                return execute(sql, params, many, context)

            with connection.execute_wrapper(note):
                a.writer._write(ended)  # as its thread writes what it gathered
            texts.append(seen)
        self.assertEqual(TaskRun.objects.filter(status=RunStatus.SUCCEEDED).count(), 10)
        self.assertIn("UPDATE", " ".join(texts[0]))  # the ends and the releases
        self.assertEqual(texts[0], texts[1])

    @pytest.mark.vendor("mysql")
    def test_the_lock_wait_is_set_once_per_connection_not_per_batch(self):
        definitions, _ = self.tasks(3)
        a = self.instance("a")
        entries = a.entries(definitions)
        sets = []
        for second in (0, 10, 20):
            self.clock.now = T0 + timedelta(seconds=second)
            with CaptureQueriesContext(connection) as queries:
                outcomes = a.batch(entries, self.clock.now)
            self.assertTrue(all(isinstance(o, Call) for o in outcomes))
            sets.append([q["sql"] for q in queries if "innodb_lock_wait_timeout" in q["sql"]])
            # On a thread of their own, as on the pool: a task's end closes its thread's
            # connection, and this thread's is the claims'.
            runner = threading.Thread(target=a.run_calls, args=(entries, outcomes))
            runner.start()
            runner.join(DEADLINE)
        connection.close()  # a new connection is given the wait again
        self.clock.now = T0 + timedelta(seconds=30)
        with CaptureQueriesContext(connection) as queries:
            a.batch(entries, self.clock.now)
        sets.append([q["sql"] for q in queries if "innodb_lock_wait_timeout" in q["sql"]])
        self.assertEqual([len(found) for found in sets[1:]], [0, 0, 1], sets)

    def test_a_lock_held_elsewhere_skips_that_firing_and_looks_again_soon(self):
        definitions, counters = self.tasks(3)
        a = self.instance("a")
        entries = a.entries(definitions)
        other = DatabaseLockProvider(owner="elsewhere")
        held = other.lock(LockConfiguration("job001", "10m"))
        self.assertIsNotNone(held)
        outcomes = a.batch(entries, T0)
        self.assertIsInstance(outcomes[0], Call)
        self.assertIsInstance(outcomes[2], Call)
        # Not claimed by anyone yet: within the misfire threshold it is looked at again.
        self.assertEqual(outcomes[1], T0 + timedelta(seconds=1))
        a.run_calls(entries, outcomes)
        self.assertEqual([c.count for c in counters], [1, 0, 1])
        self.assertEqual(ScheduledTask.objects.get(name="job001").last_fire_time, None)
        held.unlock()

    def test_firings_another_instance_claims_after_the_read_move_on_without_a_recheck(self):
        definitions, counters = self.tasks(4)
        a, b = self.instance("a"), self.instance("b")
        entries_a, entries_b = a.entries(definitions), b.entries(definitions)
        names = [entry.name for entry in entries_b]
        before = batch_rows.read_rows(names, using="default")  # b reads, then a claims
        claimed = a.batch(entries_a, T0)
        self.assertTrue(all(isinstance(outcome, Call) for outcome in claimed))
        read_rows = batch_rows.read_rows
        batch_rows.read_rows = lambda *args, **kwargs: before
        try:
            outcomes = b.batch(entries_b, T0)
        finally:
            batch_rows.read_rows = read_rows
        # b found the locks taken and the fire time claimed: it moves on to the next one,
        # rather than look again a second later.
        self.assertEqual(outcomes, [T0 + timedelta(seconds=10)] * 4)
        self.assertEqual(b.runner.skipped, 4)
        a.run_calls(entries_a, claimed)
        self.assertEqual([c.count for c in counters], [1] * 4)

    def test_a_firing_claimed_meanwhile_is_reported_skipped_at_its_own_fire_time(self):
        # Another instance, its clock ahead, claimed a later fire time after this one read the
        # rows: the skip names the fire time this instance skipped, not the other's.
        definitions, _ = self.tasks(2)
        a, b = self.instance("a"), self.instance("b")
        entries_a, entries_b = a.entries(definitions), b.entries(definitions)
        before = batch_rows.read_rows([entry.name for entry in entries_b], using="default")
        self.clock.now = T0 + timedelta(seconds=10)
        claimed = a.batch(entries_a, T0 + timedelta(seconds=10))
        self.assertTrue(all(isinstance(outcome, Call) for outcome in claimed))
        self.clock.now = T0
        skipped: list[tuple[str, datetime | None, str]] = []

        def on_run_skipped(sender, **kw):
            skipped.append((sender, kw["scheduled_at"], kw["reason"]))

        signals.run_skipped.connect(on_run_skipped, weak=False)
        self.addCleanup(signals.run_skipped.disconnect, on_run_skipped)
        read_rows = batch_rows.read_rows
        batch_rows.read_rows = lambda *args, **kwargs: before
        try:
            b.batch(entries_b, T0)
        finally:
            batch_rows.read_rows = read_rows
        run_events.drain(DEADLINE)  # the signals go out from the events thread
        self.assertEqual(
            sorted(skipped), [("job000", T0, "already run"), ("job001", T0, "already run")]
        )
        a.run_calls(entries_a, claimed)

    def test_a_failed_look_at_firings_claimed_meanwhile_still_starts_those_claimed_here(self):
        definitions, counters = self.tasks(4)
        a, b = self.instance("a"), self.instance("b")
        entries_a, entries_b = a.entries(definitions), b.entries(definitions)
        before = batch_rows.read_rows([entry.name for entry in entries_b], using="default")
        claimed = a.batch(entries_a[:2], T0)  # a claims two after b's read
        read_rows, read_claims = batch_rows.read_rows, batch_rows.read_claims

        def unavailable(*args, **kwargs):
            raise OperationalError("the database went away")

        batch_rows.read_rows, batch_rows.read_claims = (lambda *args, **kwargs: before), unavailable
        try:
            outcomes = b.batch(entries_b, T0)
        finally:
            batch_rows.read_rows, batch_rows.read_claims = read_rows, read_claims
        # Its own claims (committed) still start; the two found locked are looked at again.
        self.assertEqual(outcomes[:2], [T0 + timedelta(seconds=1)] * 2)
        self.assertTrue(all(isinstance(outcome, Call) for outcome in outcomes[2:]))
        self.assertEqual(a.run_calls(entries_a[:2], claimed) + b.run_calls(entries_b, outcomes), 4)
        self.assertEqual([c.count for c in counters], [1] * 4)

    def test_a_jittered_firing_found_locked_moves_on_once_claimed_elsewhere(self):
        (definition,), counters = self.tasks(1, fixed_rate="1m", jitter="20s")
        a = self.instance("a")
        (entry,) = a.entries([definition])
        woken = a.runner.first_fire_time(entry, now=T0)
        self.assertGreater(woken, T0)  # T0 plus its offset
        held = DatabaseLockProvider(owner="b").lock(LockConfiguration("job000", "10m"))
        assert held is not None
        self.clock.now = woken
        (outcome,) = a.batch([entry], woken)
        self.assertEqual(outcome, woken + timedelta(seconds=1))
        self.assertEqual(entry.payload.recheck, T0)  # the fire time, not the time it woke
        # The holder ran T0 and let go of the lock.
        ScheduledTask.objects.filter(name="job000").update(last_fire_time=T0)
        self.assertTrue(held.unlock())
        self.clock.now = woken + timedelta(seconds=1)
        (outcome,) = a.batch([entry], woken + timedelta(seconds=1))
        self.assertIsNone(entry.payload.recheck)
        self.assertEqual(outcome, a.runner.first_fire_time(entry, now=self.clock.now))
        self.assertGreater(outcome, T0 + timedelta(minutes=1))
        self.assertEqual(counters[0].count, 0)

    def test_what_a_task_activates_does_not_leak_into_the_next_on_the_thread(self):
        seen = []

        def activates() -> None:
            translation.activate("de")
            timezone.activate(ZoneInfo("Asia/Tokyo"))

        def looks() -> None:
            seen.append((translation.get_language(), timezone.get_current_timezone_name()))

        definitions = [
            self.registry.add(activates, name="a-activates", fixed_rate="10s"),
            self.registry.add(looks, name="b-looks", fixed_rate="10s"),
        ]
        a = self.instance("a")
        entries = a.entries(definitions)
        with translation.override("en"):
            a.run_calls(entries, a.batch(entries, T0))  # in order, on this thread
            self.assertEqual(seen, [("en", timezone.get_default_timezone_name())])
            self.assertEqual(translation.get_language(), "en")

    def test_a_failing_task_is_recorded_as_failed_and_keeps_its_schedule(self):
        failing = Counter(ValueError("bad <input>"))
        definitions = [
            self.registry.add(failing, name="failing", fixed_rate="10s"),
            self.registry.add(Counter(), name="fine", fixed_rate="10s"),
        ]
        a = self.instance("a")
        entries = a.entries(definitions)
        a.run_calls(entries, a.batch(entries, T0))
        run = TaskRun.objects.get(task_name="failing")
        self.assertEqual((run.status, run.error_type), (RunStatus.FAILED, "builtins.ValueError"))
        self.assertEqual(run.error_message, "bad <input>")
        self.assertEqual(TaskRun.objects.get(task_name="fine").status, RunStatus.SUCCEEDED)
        self.assertEqual(a.next_times["failing"], T0 + timedelta(seconds=10))

    def test_with_the_history_off_nothing_is_recorded_and_each_firing_runs_once(self):
        definitions, counters = self.tasks(4)
        a, b = self.instance("a", history=False), self.instance("b", history=False)
        entries_a, entries_b = a.entries(definitions), b.entries(definitions)
        ran = a.run_calls(entries_a, a.batch(entries_a, T0))
        ran += b.run_calls(entries_b, b.batch(entries_b, T0))
        self.assertEqual(ran, 4)
        self.assertEqual([c.count for c in counters], [1] * 4)
        self.assertFalse(TaskRun.objects.exists())

    def test_a_batch_that_meets_a_deadlock_is_claimed_again_at_once(self):
        definitions, counters = self.tasks(3)
        a = self.instance("a")
        entries = a.entries(definitions)
        provider = a.runner.provider
        real = provider.lock_many
        attempts = []

        def crossed_once(*args, **kwargs):
            attempts.append(kwargs.get("joined"))
            if len(attempts) == 1:
                real(*args, **kwargs)  # takes the locks; the rollback undoes it
                deadlock = OperationalError(1213, "Deadlock found when trying to get lock")
                raise LockError("Could not take 3 locks") from deadlock
            return real(*args, **kwargs)

        provider.lock_many = crossed_once
        outcomes = a.batch(entries, T0)
        self.assertEqual(attempts, [True, True])
        self.assertTrue(all(isinstance(o, Call) for o in outcomes), outcomes)
        a.run_calls(entries, outcomes)
        self.assertEqual([c.count for c in counters], [1, 1, 1])
        self.assertEqual(TaskRun.objects.count(), 3)

    def test_a_provider_whose_unlock_many_takes_no_names_gets_a_handle_for_each(self):
        # A provider's override written before unlock_many took by_name= still releases every
        # lock of a batch, with a handle made for each name.
        definitions, _ = self.tasks(3)
        a = self.instance("a")
        entries = a.entries(definitions)
        provider = a.runner.provider
        real = provider.unlock_many
        released: list[str] = []

        def unlock_many(locks, *, joined=False):
            released.extend(lock.config.name for lock in locks)
            return real(locks, joined=joined)

        provider.unlock_many = unlock_many
        self.assertEqual(a.run_calls(entries, a.batch(entries, T0)), 3)
        self.assertEqual(sorted(released), ["job000", "job001", "job002"])
        self.assertEqual(TaskRun.objects.filter(status=RunStatus.SUCCEEDED).count(), 3)
        for lock in TaskLock.objects.all():
            self.assertLessEqual(lock.lock_until, datetime.now(UTC))

    def test_ends_whose_commit_deadlocks_are_written_one_by_one_and_release_their_locks(self):
        definitions, counters = self.tasks(4)
        a = self.instance("a")
        entries = a.entries(definitions)
        provider = a.runner.provider
        real = provider.unlock_many

        def deadlocks_in_a_transaction(locks, *, joined=False, **names):
            lost = real(locks, joined=joined, **names)
            if joined:  # the statement ran; the database then rolls the transaction back
                deadlock = OperationalError(1213, "Deadlock found when trying to get lock")
                raise LockError("Could not release 4 locks") from deadlock
            return lost

        provider.unlock_many = deadlocks_in_a_transaction
        a.run_calls(entries, a.batch(entries, T0))
        self.assertEqual([c.count for c in counters], [1] * 4)
        # Every run finished: recorded, its lock released, its task scheduled again.
        self.assertEqual(TaskRun.objects.filter(status=RunStatus.SUCCEEDED).count(), 4)
        for lock in TaskLock.objects.all():
            self.assertLessEqual(lock.lock_until, datetime.now(UTC))
        self.assertEqual(len(a.next_times), 4)
        self.assertEqual(len(a.outbox), 0)

    def test_with_the_history_off_a_firing_claimed_elsewhere_meanwhile_leaves_the_others(self):
        definitions, counters = self.tasks(4)
        a = self.instance("a", history=False)
        entries = a.entries(definitions)
        real = batch_rows.read_rows

        def then_claimed_elsewhere(names, *, using):
            found = real(names, using=using)
            # Another instance ran job001's fire time between this read and the locks.
            ScheduledTask.objects.filter(name="job001").update(last_fire_time=T0)
            return found

        batch_rows.read_rows = then_claimed_elsewhere
        try:
            outcomes = a.batch(entries, T0)
        finally:
            batch_rows.read_rows = real
        self.assertIsInstance(outcomes[0], Call)
        self.assertNotIsInstance(outcomes[1], Call)
        a.run_calls(entries, outcomes)
        self.assertEqual([c.count for c in counters], [1, 0, 1, 1])
        for lock in TaskLock.objects.all():
            self.assertLessEqual(lock.lock_until, datetime.now(UTC))

    def test_a_run_that_escapes_the_task_wrapper_still_ends_and_frees_its_lock(self):
        async def cancelled() -> None:
            raise asyncio.CancelledError  # a BaseException: the task wrapper lets it through

        definitions = [self.registry.add(cancelled, name="cancelled", fixed_rate="10s")]
        a = self.instance("a")
        entries = a.entries(definitions)
        a.run_calls(entries, a.batch(entries, T0))
        run = TaskRun.objects.get()
        self.assertEqual(run.status, RunStatus.FAILED)
        self.assertEqual(run.error_type, "asyncio.exceptions.CancelledError")
        self.assertLessEqual(TaskLock.objects.get().lock_until, datetime.now(UTC))
        self.assertIn("cancelled", a.next_times)  # scheduled again

    @pytest.mark.vendor("mysql", "postgresql")  # SQLite has no row locks
    def test_a_lock_row_kept_locked_by_another_session_sends_the_batch_one_at_a_time(self):
        definitions, _ = self.tasks(3)
        a = self.instance("a")
        entries = a.entries(definitions)
        a.run_calls(entries, a.batch(entries, T0))  # the lock rows exist from here on
        self.clock.now = T0 + timedelta(seconds=10)
        stuck = connections.create_connection("default")  # an admin session left open
        self.addCleanup(stuck.close)
        stuck.set_autocommit(False)
        with stuck.cursor() as cursor:
            table = connection.ops.quote_name(TaskLock._meta.db_table)
            column = connection.ops.quote_name("name")
            cursor.execute(f"SELECT * FROM {table} WHERE {column} = 'job001' FOR UPDATE")
        try:
            started = time.monotonic()
            outcomes = a.batch(entries, T0 + timedelta(seconds=10))
            waited = time.monotonic() - started
        finally:
            stuck.rollback()
        # Then each alone: job001 counts as held elsewhere, the others are claimed.
        self.assertIsInstance(outcomes[0], Call)
        self.assertIsInstance(outcomes[1], datetime)
        self.assertIsInstance(outcomes[2], Call)
        self.assertLess(waited, 10)  # two waits of lock_wait_timeout (2 s), not MySQL's 50 s
        self.assertEqual(a.run_calls(entries, outcomes), 2)
        later = TaskRun.objects.filter(scheduled_at=T0 + timedelta(seconds=10))
        self.assertEqual(sorted(later.values_list("task_name", flat=True)), ["job000", "job002"])

    def test_a_row_deleted_while_the_scheduler_runs_is_made_again_and_its_task_runs(self):
        definitions, counters = self.tasks(2)
        a = self.instance("a")
        entries = a.entries(definitions)
        ScheduledTask.objects.filter(name="job000").delete()
        outcomes = a.batch(entries, T0)
        self.assertEqual(a.run_calls(entries, outcomes), 2)
        self.assertEqual([counter.count for counter in counters], [1, 1])
        self.assertEqual(ScheduledTask.objects.get(name="job000").last_fire_time, T0)


class BatchLockTests(TransactionTestCase):
    def setUp(self) -> None:
        self.provider = DatabaseLockProvider(owner="a")
        self.now = datetime.now(UTC)

    def configs(self, *names: str, most: str = "1m") -> list[LockConfiguration]:
        return [LockConfiguration(name, most) for name in names]

    def test_absent_rows_are_inserted_and_free_rows_taken_held_ones_left(self):
        held = DatabaseLockProvider(owner="b").lock(LockConfiguration("held", "10m"))
        assert held is not None
        free = DatabaseLockProvider(owner="b").lock(LockConfiguration("free", "1m"))
        assert free is not None and free.unlock()
        configs = self.configs("new", "free", "held")
        locks = self.provider.lock_many(configs, now=datetime.now(UTC), absent={"new"})
        self.assertEqual(sorted(locks), ["free", "new"])
        rows = {row.name: row for row in TaskLock.objects.all()}
        self.assertEqual(rows["held"].locked_by, "b")
        for name in ("new", "free"):
            self.assertEqual(rows[name].locked_by, "a")
            self.assertEqual(rows[name].locked_at, locks[name].locked_at)
        self.assertEqual(self.provider.unlock_many(list(locks.values())), set())
        self.assertFalse(any(lock.valid for lock in locks.values()))
        self.assertIsNotNone(DatabaseLockProvider(owner="c").lock(self.configs("new")[0]))

    def test_joined_locks_take_effect_with_the_transaction_and_not_without(self):
        class Rollback(Exception):
            pass

        try:
            with transaction.atomic():
                locks = self.provider.lock_many(
                    self.configs("x"), now=datetime.now(UTC), absent={"x"}, joined=True
                )
                self.assertEqual(list(locks), ["x"])
                raise Rollback
        except Rollback:
            pass
        self.assertFalse(TaskLock.objects.filter(name="x").exists())
        with transaction.atomic():
            locks = self.provider.lock_many(
                self.configs("x"), now=datetime.now(UTC), absent={"x"}, joined=True
            )
        self.assertEqual(TaskLock.objects.get(name="x").locked_by, "a")
        with transaction.atomic():
            self.assertEqual(self.provider.unlock_many(list(locks.values()), joined=True), set())
        self.assertLessEqual(TaskLock.objects.get(name="x").lock_until, datetime.now(UTC))

    def test_a_lock_taken_over_meanwhile_is_reported_lost_at_release(self):
        locks = self.provider.lock_many(
            self.configs("x", "y"), now=datetime.now(UTC), absent={"x", "y"}
        )
        # x expired and another instance took it.
        TaskLock.objects.filter(name="x").update(
            locked_by="b", locked_at=datetime.now(UTC) + timedelta(seconds=1)
        )
        self.assertEqual(self.provider.unlock_many(list(locks.values())), {"x"})
        self.assertEqual(TaskLock.objects.get(name="x").locked_by, "b")
        self.assertLessEqual(TaskLock.objects.get(name="y").lock_until, datetime.now(UTC))

    def _two_acquisitions(self) -> list:
        first = self.provider.lock_many(
            self.configs("a1", "a2"), now=datetime.now(UTC), absent={"a1", "a2"}
        )
        held_on = [LockConfiguration("b1", "2m", "30s"), LockConfiguration("b2", "2m", "30s")]
        second = self.provider.lock_many(held_on, now=datetime.now(UTC), absent={"b1", "b2"})
        self.assertNotEqual(first["a1"].locked_at, second["b1"].locked_at)
        return [*first.values(), *second.values()]

    def test_the_locks_of_several_acquisitions_are_released_and_a_lost_one_reported(self):
        # The writer releases the locks of runs claimed by several batches at once.
        locks = self._two_acquisitions()
        # b1 expired and another instance took it.
        TaskLock.objects.filter(name="b1").update(
            locked_by="b", locked_at=datetime.now(UTC) + timedelta(seconds=1)
        )
        self.assertEqual(self.provider.unlock_many(locks), {"b1"})
        self.assertFalse(any(lock.valid for lock in locks))
        now = datetime.now(UTC)
        for name in ("a1", "a2"):
            self.assertLessEqual(TaskLock.objects.get(name=name).lock_until, now)
        # Each held until its own lock_at_least_for has passed.
        b2 = next(lock for lock in locks if lock.config.name == "b2")
        self.assertEqual(
            TaskLock.objects.get(name="b2").lock_until, b2.locked_at + timedelta(seconds=30)
        )
        self.assertEqual(TaskLock.objects.get(name="b1").locked_by, "b")
        self.assertGreater(TaskLock.objects.get(name="b1").lock_until, now)

    def test_joined_releases_of_several_acquisitions_take_effect_with_the_transaction(self):
        locks = self._two_acquisitions()

        class Rollback(Exception):
            pass

        with self.assertRaises(Rollback), transaction.atomic():
            self.assertEqual(self.provider.unlock_many(locks, joined=True), set())
            raise Rollback
        # Rolled back: still held, and the handles can release them.
        self.assertTrue(all(lock.valid for lock in locks))
        self.assertEqual(set(TaskLock.objects.values_list("locked_by", flat=True)), {"a"})
        self.assertGreater(TaskLock.objects.get(name="a1").lock_until, datetime.now(UTC))
        with transaction.atomic():
            self.assertEqual(self.provider.unlock_many(locks, joined=True), set())
        self.assertFalse(any(lock.valid for lock in locks))
        self.assertLessEqual(TaskLock.objects.get(name="a1").lock_until, datetime.now(UTC))

    def test_locks_released_by_name_through_their_batch_handle(self):
        # A batch keeps one handle for the locks it took together; each lock is released by
        # its name through it, with handles of another acquisition in the same call.
        locks = self._two_acquisitions()
        a1 = next(lock for lock in locks if lock.config.name == "a1")
        b_handles = [lock for lock in locks if lock.config.name.startswith("b")]
        # b1 expired and another instance took it.
        TaskLock.objects.filter(name="b1").update(
            locked_by="b", locked_at=datetime.now(UTC) + timedelta(seconds=1)
        )

        class Rollback(Exception):
            pass

        with self.assertRaises(Rollback), transaction.atomic():
            lost = self.provider.unlock_many(b_handles, joined=True, by_name={a1: ["a1", "a2"]})
            self.assertEqual(lost, {"b1"})
            raise Rollback
        self.assertGreater(TaskLock.objects.get(name="a2").lock_until, datetime.now(UTC))
        with transaction.atomic():
            lost = self.provider.unlock_many(b_handles, joined=True, by_name={a1: ["a1", "a2"]})
        self.assertEqual(lost, {"b1"})
        now = datetime.now(UTC)
        for name in ("a1", "a2"):
            self.assertLessEqual(TaskLock.objects.get(name=name).lock_until, now)
        self.assertEqual(TaskLock.objects.get(name="b1").locked_by, "b")
        self.assertGreater(TaskLock.objects.get(name="b1").lock_until, now)
        # The released handles are spent; the batch's handle is not: it is only a template.
        self.assertFalse(any(lock.valid for lock in b_handles))
        self.assertTrue(a1.valid)

    def test_a_provider_without_batches_releases_names_one_handle_at_a_time(self):
        released = []

        class Shared(Lock):
            __slots__ = ()

            def _shared(self):
                return "one acquisition"

            def _named(self, name):
                config = self.config._renamed(name)
                return Shared(config, locked_at=self.locked_at, lock_until=self.lock_until)

            def _unlock(self):
                released.append(self.config.name)
                return self.config.name != "taken"  # another holder has it now

        handle = Shared(LockConfiguration("x", "1m"), locked_at=self.now, lock_until=self.now)
        lost = BaseLockProvider().unlock_many([], by_name={handle: ["x", "taken"]})
        self.assertEqual((lost, released), ({"taken"}, ["x", "taken"]))
        self.assertTrue(handle.valid)  # a template: each name had a handle of its own

    def test_a_release_that_fails_halfway_leaves_only_the_rest_to_the_outbox(self):
        # Released without a transaction, each acquisition's statement commits on its own: the
        # names of the first are released when the second fails, and must not be released
        # again later (a name has no handle that could tell it was spent).
        locks = self._two_acquisitions()
        a1 = next(lock for lock in locks if lock.config.name == "a1")
        b1 = next(lock for lock in locks if lock.config.name == "b1")
        outbox = Outbox()
        writer = EndWriter(using="default", provider=self.provider, outbox=outbox, name="w")
        real = self.provider._execute
        calls = []

        def second_fails(sql, statement, params, *args, **kwargs):
            if statement.startswith("UPDATE"):
                calls.append(statement)
                if len(calls) == 2:
                    raise OperationalError("the database went away")
            return real(sql, statement, params, *args, **kwargs)

        self.provider._execute = second_fails
        with self.assertLogs("django_scheduling", "WARNING"):
            self.assertEqual(writer.release([], {a1: ["a1", "a2"], b1: ["b1", "b2"]}), set())
        del self.provider._execute
        self.assertEqual(len(outbox), 2)  # b1 and b2, not a1 and a2 again
        now = datetime.now(UTC)
        self.assertLessEqual(TaskLock.objects.get(name="a1").lock_until, now)
        self.assertGreater(TaskLock.objects.get(name="b1").lock_until, now)
        # a1 is taken by another instance meanwhile: the outbox must not touch it.
        self.assertIsNotNone(DatabaseLockProvider(owner="c").lock(LockConfiguration("a1", "1m")))
        self.assertEqual(outbox.flush(), 2)
        self.assertEqual(TaskLock.objects.get(name="a1").locked_by, "c")
        self.assertGreater(TaskLock.objects.get(name="a1").lock_until, datetime.now(UTC))
        self.assertEqual(
            TaskLock.objects.get(name="b2").lock_until, b1.locked_at + timedelta(seconds=30)
        )

    def test_lock_at_least_for_holds_a_released_lock_until_it_has_passed(self):
        config = LockConfiguration("x", "1m", "30s")
        locks = self.provider.lock_many([config], now=datetime.now(UTC), absent={"x"})
        self.assertEqual(self.provider.unlock_many(list(locks.values())), set())
        until = TaskLock.objects.get(name="x").lock_until
        self.assertEqual(until, locks["x"].locked_at + timedelta(seconds=30))
        self.assertIsNone(DatabaseLockProvider(owner="b").lock(LockConfiguration("x", "1m")))


def _works(names: list[str]) -> list:
    return [delay_queue.Due(Entry(name), T0) for name in names]  # type: ignore[arg-type]


def test_batches_are_cut_in_name_order_whatever_the_order_of_the_heap() -> None:
    names = [f"task-{index:02d}" for index in range(10)]
    shuffled = names[::3] + names[1::3] + names[2::3]
    batches = delay_queue.in_batches(_works(shuffled), 4, start=0.0)
    assert [[work.entry.name for work in batch] for batch in batches] == [
        names[0:4],
        names[4:8],
        names[8:10],
    ]


@pytest.mark.parametrize(("start", "first"), [(0.0, 0), (0.34, 1), (0.5, 1), (0.67, 2), (0.99, 2)])
def test_claims_begin_at_the_batch_at_start_and_wrap_around(start: float, first: int) -> None:
    names = [f"task-{index:02d}" for index in range(9)]
    batches = delay_queue.in_batches(_works(names), 3, start=start)
    firsts = [batch[0].entry.name for batch in batches]
    expected = ["task-00", "task-03", "task-06"]
    assert firsts == expected[first:] + expected[:first]
    assert sorted(work.entry.name for batch in batches for work in batch) == names


@pytest.mark.vendor("postgresql")
@pytest.mark.django_db
def test_array_literals_read_back_as_the_values_they_hold():
    # The batches' arrays go to PostgreSQL as the text of array literals (see sql.array_literal).
    texts = ["plain", 'a "quoted" name', "back\\slash", "comma,brace{}", "", "NULL", "it's"]
    texts += ["ü", 'both \\" and \\\\', " spaced ", None]
    berlin = datetime(2026, 3, 29, 3, 30, 0, 5, tzinfo=ZoneInfo("Europe/Berlin"))
    times = [T0, T0 + timedelta(microseconds=1), berlin, None, T0]
    # The hour repeated when the clocks go back: equal wall times, an hour apart.
    first = datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    times += [first, first.replace(fold=1)]
    numbers = [1, -2, 2**40, None]
    small = [0, 7, None]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT %s::text[], %s::timestamptz[], %s::bigint[], %s::integer[], %s::text[]",
            [
                array_literal("text", texts),
                array_literal("timestamptz", times),
                array_literal("bigint", numbers),
                array_literal("integer", small),
                array_literal("text", []),
            ],
        )
        row = cursor.fetchone()
    assert (row[0], row[2], row[3], row[4]) == (texts, numbers, small, [])
    # As instants (a time in a repeated hour never equals one of another zone in Python).
    instants = [None if time is None else time.timestamp() for time in row[1]]
    assert instants == [None if time is None else time.timestamp() for time in times]
    assert row[1][-1] - row[1][-2] == timedelta(hours=1)
    with pytest.raises(ValueError, match="naive"):
        array_literal("timestamptz", [datetime(2026, 1, 1)])
    with pytest.raises(ValueError, match="'boolean'"):  # not written as a number by mistake
        array_literal("boolean", [True])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "session_zone",
    # A session time zone of its own: PostgreSQL only (MySQL's DATETIME columns hold no zone
    # for a session's to convert).
    [None, pytest.param("America/New_York", marks=pytest.mark.vendor("postgresql"))],
)
def test_the_rows_of_a_batch_are_read_with_the_times_the_orm_reads(session_zone):
    # read_rows and read_claims select their datetimes as text, and parse each distinct value
    # themselves.
    times = {
        "anchor": T0 + timedelta(microseconds=120000),  # PostgreSQL prints ".12"
        "last_fire_time": T0 + timedelta(seconds=1),
        "last_finished_at": T0 + timedelta(seconds=1, microseconds=654321),
        "run_requested_at": T0 + timedelta(seconds=2, microseconds=1),
    }
    run = TaskRun.objects.create(
        task_name="timed", started_at=T0, status=RunStatus.SUCCEEDED, instance="a"
    )
    ScheduledTask.objects.create(
        name="timed", kind="cron", trigger="every second", last_run=run, **times
    )
    ScheduledTask.objects.create(name="bare", kind="cron", trigger="every second", anchor=T0)
    DatabaseLockProvider(owner="holder").lock(LockConfiguration("timed", "10m"))
    lock = TaskLock.objects.get(name="timed")
    if session_zone is not None:
        with connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE %s", [session_zone])
    try:
        before = database_now()
        found = batch_rows.read_rows(["timed", "bare"], using="default")
        after = database_now()
    finally:
        if session_zone is not None:
            with connection.cursor() as cursor:
                cursor.execute("SET TIME ZONE 'UTC'")
    timed, bare = found.rows["timed"], found.rows["bare"]
    assert timed.state.anchor == times["anchor"]
    assert timed.state.last_fire_time == times["last_fire_time"]
    assert timed.state.last_finished == times["last_finished_at"]
    assert timed.run_requested_at == times["run_requested_at"]
    assert (bare.state.anchor, bare.state.last_fire_time, bare.run_requested_at) == (T0, None, None)
    assert found.locks["timed"] == (lock.locked_at, "holder", lock.lock_until)
    assert "bare" not in found.locks
    for value in (timed.state.anchor, *found.locks["timed"][::2]):
        assert value.utcoffset() == timedelta(0)
    assert batch_rows.read_claims(["timed", "bare"], using="default") == {
        "timed": (times["last_fire_time"], run.id),
        "bare": (None, None),
    }
    if connection.vendor != "sqlite":  # SQLite has no clock of its own in the statement
        assert found.now is not None
        assert before - timedelta(seconds=1) <= found.now <= after + timedelta(seconds=1)


class ClaimThreadTests(TransactionTestCase):
    def test_a_scheduler_on_sqlite_claims_on_one_thread_and_on_two_elsewhere(self):
        # SQLite takes one writer at a time: a second claim thread only waited for the
        # first's write lock, on a connection (and page cache) of its own.
        expected = 1 if connection.vendor == "sqlite" else CLAIM_THREADS
        claimers: set[str] = set()

        def created(sender, connection, **kwargs):
            name = threading.current_thread().name
            if "-claims" in name:
                claimers.add(name)

        connection_created.connect(created)
        self.addCleanup(connection_created.disconnect, created)
        counter = Counter()
        registry = TaskRegistry()
        # Three batches due at once (one hour apart from the next): the claim threads share
        # them out.
        definitions = [
            registry.add(counter, name=f"job{i:03}", fixed_rate="1h")
            for i in range(3 * delay_queue.BATCH_SIZE)
        ]
        service = SchedulerService(definitions, tasks=registry)
        service.start()
        self.addCleanup(service.stop, DEADLINE)
        assert service.scheduler is not None
        self.assertEqual(service.scheduler.claims.threads, expected)
        poll_until(lambda: counter.count == len(definitions), timeout=DEADLINE)
        self.assertGreaterEqual(len(claimers), 1)
        self.assertLessEqual(len(claimers), expected)
