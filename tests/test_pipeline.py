"""Every kind of firing through the one pipeline, in batches: tasks with ``lock=False``, tasks
enqueued on django-tasks-db (in the claim's transaction) and on Celery (published after it),
and a bounded pool that rejects before the claim. Then the parts that record: the writer,
whose thread survives what its call backs raise, and the outbox, which sets aside a write
that fails for good.

Real database, real lock provider, real engines (django-tasks-db, Celery on the test Redis),
as in test_batches.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import UTC, datetime, timedelta
from unittest import mock

import redis
from django.db import IntegrityError, OperationalError, connection
from django.test import SimpleTestCase, TransactionTestCase
from django.test.utils import CaptureQueriesContext
from django_tasks_db.models import DBTaskResult

from django_scheduling.conf import get_settings
from django_scheduling.locking import DatabaseLockProvider
from django_scheduling.models import RunStatus, ScheduledTask, SchedulerInstance, TaskLock, TaskRun
from django_scheduling.observability import health
from django_scheduling.runtime.calls import Call
from django_scheduling.runtime.firing import FiringPipeline
from django_scheduling.runtime.outbox import LONG_AFTER, Outbox
from django_scheduling.runtime.scheduler import Scheduler
from django_scheduling.runtime.writer import EndWriter, Finished
from django_scheduling.storage import instances
from django_scheduling.tasks import engines
from tests.engines_celery import REDIS_URL
from tests.engines_celery import app as celery_app
from tests.testapp.engine_tasks import celery_record, tasks_record

from .test_batches import CONTROL, T0, Counter, Instances
from .test_execution import poll_until

DEADLINE = 30.0


class UnlockedBatchTests(Instances):
    """``lock=False``: run on every instance, each on its own schedule, with no lock."""

    def unlocked(self, count: int, prefix: str = "u") -> tuple[list, list[Counter]]:
        counters = [Counter() for _ in range(count)]
        definitions = [
            self.registry.add(counter, name=f"{prefix}{i:03}", fixed_rate="10s", lock=False)
            for i, counter in enumerate(counters)
        ]
        return definitions, counters

    def test_a_batch_runs_on_every_instance_without_locks_and_records_each_run(self):
        definitions, counters = self.unlocked(20)
        a, b = self.instance("a"), self.instance("b")
        for instance in (a, b):
            entries = instance.entries(definitions)
            self.assertEqual(instance.run_calls(entries, instance.batch(entries, T0)), 20)
        self.assertEqual([counter.count for counter in counters], [2] * 20)
        self.assertFalse(TaskLock.objects.exists())
        runs = TaskRun.objects.all()
        self.assertEqual(runs.count(), 40)
        self.assertEqual(
            {(run.status, run.scheduled_at) for run in runs}, {(RunStatus.SUCCEEDED, T0)}
        )
        self.assertEqual({run.instance for run in runs}, {"a", "b"})
        self.assertEqual(set(a.next_times.values()), {T0 + timedelta(seconds=10)})
        # The row says when the task fires next, and which run it saw last.
        row = ScheduledTask.objects.get(name="u000")
        self.assertEqual(row.next_fire_time, T0 + timedelta(seconds=10))
        self.assertIn(
            row.last_run_id, set(runs.filter(task_name="u000").values_list("pk", flat=True))
        )

    def test_the_statements_of_an_unlocked_batch_do_not_grow_with_its_size(self):
        counts = []
        for size, prefix in ((5, "small"), (60, "large")):
            definitions, counters = self.unlocked(size, prefix)
            a = self.instance(f"a-{prefix}")
            entries = a.entries(definitions)
            with CaptureQueriesContext(connection) as queries:
                outcomes = a.batch(entries, T0)
            self.assertTrue(all(isinstance(outcome, Call) for outcome in outcomes))
            counts.append(len([q for q in queries if not q["sql"].startswith(CONTROL)]))
            self.assertEqual(a.run_calls(entries, outcomes), size)
            self.assertEqual({counter.count for counter in counters}, {1})
        self.assertEqual(counts[0], counts[1])
        # Read the rows, record the runs (MySQL adds the read of their ids), note them and their
        # next fire times in the rows: no lock, no claim.
        self.assertLessEqual(counts[1], 3 if connection.vendor != "mysql" else 4)

    def test_the_ends_of_a_batch_are_written_in_one_commit(self):
        definitions, _ = self.unlocked(30)
        a = self.instance("a")
        entries = a.entries(definitions)
        outcomes = a.batch(entries, T0)
        commits = []
        real_write = a.writer._write_together

        def counted(*args, **kwargs):
            commits.append(len(args[0]))
            return real_write(*args, **kwargs)

        a.writer._write_together = counted  # type: ignore[method-assign]
        # A writer whose thread has not started yet: the ends wait for it, then go together.
        a.writer.stop(timeout=DEADLINE)
        a.writer._thread, a.writer._exited, a.writer._stopped = None, False, False
        for entry, outcome in zip(entries, outcomes, strict=True):
            outcome.entry = entry
            outcome.run(lambda call, next_time: None)
        a.writer.start()
        self.assertTrue(a.writer.drain(DEADLINE))
        self.assertEqual(commits, [30])
        self.assertEqual(TaskRun.objects.filter(status=RunStatus.SUCCEEDED).count(), 30)


class EnqueuedBatchTests(Instances):
    """Tasks on an engine: claimed in batches like the others."""

    def test_django_tasks_db_enqueues_a_whole_batch_in_the_claims_transaction(self):
        definitions = [
            self.registry.add(
                tasks_record, name=f"t{i:03}", fixed_rate="10s", kwargs={"name": f"t{i}"}
            )
            for i in range(25)
        ]
        a, b = self.instance("a"), self.instance("b")
        entries_a, entries_b = a.entries(definitions), b.entries(definitions)
        outcomes = a.batch(entries_a, T0)
        self.assertEqual(DBTaskResult.objects.count(), 25)  # committed with the claims
        # The other instance finds every fire time claimed: nothing enqueued twice.
        self.assertEqual(b.batch(entries_b, T0), [T0 + timedelta(seconds=10)] * 25)
        self.assertEqual(a.run_calls(entries_a, outcomes), 25)
        runs = TaskRun.objects.order_by("task_name")
        self.assertEqual({run.status for run in runs}, {RunStatus.ENQUEUED})
        self.assertEqual(
            {run.result_id for run in runs},
            {str(pk) for pk in DBTaskResult.objects.values_list("pk", flat=True)},
        )
        self.assertEqual(DBTaskResult.objects.count(), 25)
        self.assertLessEqual(TaskLock.objects.get(name="t000").lock_until, datetime.now(UTC))

    def test_a_batch_claimed_ahead_of_its_time_is_enqueued_to_run_at_it(self):
        definitions = [
            self.registry.add(tasks_record, name=f"t{i:03}", fixed_rate="10s", kwargs={"name": "x"})
            for i in range(3)
        ]
        a = self.instance("a")
        entries = a.entries(definitions)
        self.clock.now = T0 - timedelta(milliseconds=500)  # a burst claimed ahead
        a.batch(entries, T0)
        self.assertEqual(set(DBTaskResult.objects.values_list("run_after", flat=True)), {T0})

    def test_an_enqueue_that_fails_in_the_database_leaves_no_claim_without_its_enqueue(self):
        definitions = [
            self.registry.add(
                tasks_record, name=f"t{i:03}", fixed_rate="10s", kwargs={"name": f"t{i}"}
            )
            for i in range(3)
        ]
        a = self.instance("a")
        entries = a.entries(definitions)
        real = engines.enqueue

        def enqueue(obj, engine, args, kwargs, **options):
            if kwargs["name"] == "t1":
                raise OperationalError("the tasks table is locked")
            return real(obj, engine, args, kwargs, **options)

        with mock.patch.object(engines, "enqueue", enqueue):
            outcomes = a.batch(entries, T0)
        # The batch rolled back, then each went alone: t001 backs off, unclaimed.
        self.assertIsInstance(outcomes[0], Call)
        self.assertIsInstance(outcomes[1], datetime)
        self.assertIsInstance(outcomes[2], Call)
        self.assertEqual(
            dict(ScheduledTask.objects.values_list("name", "last_fire_time")),
            {"t000": T0, "t001": None, "t002": T0},
        )
        self.assertEqual(DBTaskResult.objects.count(), 2)
        self.assertEqual(a.run_calls(entries, outcomes), 2)


class CeleryBatchTests(Instances):
    def setUp(self) -> None:
        super().setUp()
        self.queue = f"test-pipeline-{os.getpid()}"
        celery_app.conf.task_default_queue = self.queue
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.redis.ping()  # scripts/test starts the server: fail here with the reason if not
        self.redis.delete(self.queue)
        self.addCleanup(self.redis.delete, self.queue)

    def celery_tasks(self, count: int) -> list:
        return [
            self.registry.add(
                celery_record, name=f"c{i:03}", fixed_rate="10s", kwargs={"name": "c"}
            )
            for i in range(count)
        ]

    def test_a_batch_is_claimed_together_then_published_by_the_pool(self):
        definitions = self.celery_tasks(20)
        a = self.instance("a")
        entries = a.entries(definitions)
        outcomes = a.batch(entries, T0)
        self.assertEqual(self.redis.llen(self.queue), 0)  # published after the claim, by the pool
        self.assertEqual(ScheduledTask.objects.filter(last_fire_time=T0).count(), 20)
        self.assertEqual(a.run_calls(entries, outcomes), 20)
        messages = [json.loads(raw) for raw in self.redis.lrange(self.queue, 0, -1)]
        runs = TaskRun.objects.all()
        self.assertEqual(
            sorted(message["headers"]["id"] for message in messages),
            sorted(run.result_id for run in runs),
        )
        self.assertEqual(
            {(run.status, run.backend) for run in runs}, {(RunStatus.ENQUEUED, "celery")}
        )

    def test_a_batch_claimed_ahead_of_its_time_is_published_at_once_to_run_at_it(self):
        definitions = self.celery_tasks(5)
        a = self.instance("a")
        entries = a.entries(definitions)
        self.clock.now = T0 - timedelta(milliseconds=500)  # a burst claimed ahead
        outcomes = a.batch(entries, T0)
        # Handed to the pool at once, not kept in the delay queue until T0...
        self.assertEqual([call.at for call in outcomes], [None] * 5)
        self.assertEqual(a.run_calls(entries, outcomes), 5)
        # ...for the worker to hold until then.
        messages = [json.loads(raw) for raw in self.redis.lrange(self.queue, 0, -1)]
        self.assertEqual(len(messages), 5)
        self.assertEqual({message["headers"]["eta"] for message in messages}, {T0.isoformat()})
        self.assertEqual(
            set(TaskRun.objects.values_list("status", "scheduled_at")), {(RunStatus.ENQUEUED, T0)}
        )

    def test_a_batch_claimed_at_its_time_is_published_without_an_eta(self):
        a = self.instance("a")
        entries = a.entries(self.celery_tasks(1))
        outcomes = a.batch(entries, T0)
        self.assertEqual(a.run_calls(entries, outcomes), 1)
        message = json.loads(self.redis.lindex(self.queue, 0))
        self.assertIsNone(message["headers"]["eta"])


class BoundedQueueTests(Instances):
    """A bounded queue keeps its rejection policies, and its firings are still claimed in
    batches: a firing without room is rejected before its claim, so another instance may run
    it."""

    def test_firings_without_room_are_rejected_before_the_claim_the_rest_claimed_together(self):
        counters = [Counter() for _ in range(10)]
        definitions = [
            self.registry.add(counter, name=f"job{i:03}", fixed_rate="1h")
            for i, counter in enumerate(counters)
        ]
        conf = dataclasses.replace(get_settings(), instance_name="a")
        provider = DatabaseLockProvider(owner="a")
        pipeline = FiringPipeline(conf=conf, provider=provider, default_zone=UTC)
        dispatched: list[int] = []
        dispatch = pipeline.dispatch

        def counted(items):
            dispatched.append(len(items))
            return dispatch(items)

        pipeline.dispatch = counted  # type: ignore[method-assign]
        scheduler = Scheduler(
            pipeline, core_pool_size=2, max_pool_size=2, queue_capacity=2, rejection_policy="abort"
        )
        self.addCleanup(scheduler.shutdown, 5)
        for spec in pipeline.specs(definitions, complete=False):
            scheduler.add(spec)
        scheduler.start()
        succeeded = TaskRun.objects.filter(status=RunStatus.SUCCEEDED)
        poll_until(lambda: succeeded.count() == 4)  # recorded on the worker threads
        # Rejected on the dispatcher thread, recorded through the outbox.
        poll_until(lambda: len(pipeline.outbox) == 6)
        self.assertEqual(pipeline.outbox.flush(), 6)
        self.assertEqual(TaskRun.objects.filter(status=RunStatus.REJECTED).count(), 6)
        self.assertEqual(sum(counter.count for counter in counters), 4)
        # Only the admitted ones were claimed, in one batch: the others are free for another
        # instance.
        self.assertEqual(dispatched, [4])
        claimed = set(
            ScheduledTask.objects.exclude(last_fire_time=None).values_list("name", flat=True)
        )
        self.assertEqual(claimed, {run.task_name for run in succeeded})


class WriterTests(TransactionTestCase):
    def writer(self) -> EndWriter:
        writer = EndWriter(
            using="default",
            provider=DatabaseLockProvider(owner="a"),
            outbox=Outbox(),
            name="test-writer",
        )
        writer.start()
        self.addCleanup(writer.stop, 5)
        return writer

    def test_a_call_back_that_raises_system_exit_does_not_end_the_writer(self):
        writer = self.writer()
        told = []

        def exits(lost: bool) -> None:
            raise SystemExit(3)

        writer.add(Finished("first", None, None, None, exits))
        writer.add(Finished("second", None, None, None, told.append))
        self.assertTrue(writer.drain(DEADLINE))
        self.assertTrue(writer.alive)
        self.assertEqual(told, [False])

    def test_a_writer_thread_that_died_is_started_again(self):
        writer = self.writer()
        thread = writer._thread
        assert thread is not None
        writer._loop = lambda: None  # type: ignore[method-assign]  # the next thread ends at once
        writer.stop(timeout=DEADLINE)  # this one exits as a stop asks...
        thread.join(DEADLINE)
        writer._stopped, writer._exited = False, False  # ...but as if it had died
        del writer._loop
        told = []
        with self.assertLogs("django_scheduling.runtime.writer", "ERROR") as logs:
            writer.add(Finished("job", None, None, None, told.append))
        self.assertIn("has died; starting another", logs.output[0])
        self.assertTrue(writer.drain(DEADLINE))
        self.assertEqual(told, [False])
        self.assertTrue(writer.alive)


class OutboxTests(SimpleTestCase):
    def test_a_write_that_fails_for_good_is_set_aside_and_the_others_are_made(self):
        outbox = Outbox()
        made = []

        def refused() -> None:
            raise IntegrityError("duplicate key")

        outbox.add("a refused write", refused)
        outbox.add("a good write", lambda: made.append("good"))
        with self.assertLogs("django_scheduling.runtime.outbox", "ERROR") as logs:
            self.assertEqual(outbox.flush(), 1)
        self.assertIn("a refused write", logs.output[0])
        self.assertIn("set aside", logs.output[0])
        self.assertEqual((made, len(outbox), outbox.set_aside), (["good"], 0, 1))

    def test_a_transient_failure_keeps_the_write_and_those_behind_it(self):
        outbox = Outbox()
        down = [True]
        made = []

        def write() -> None:
            if down[0]:
                raise OperationalError("server has gone away")
            made.append("first")

        outbox.add("first", write)
        outbox.add("second", lambda: made.append("second"))
        self.assertEqual(outbox.flush(), 0)
        self.assertEqual((len(outbox), outbox.set_aside), (2, 0))
        down[0] = False
        self.assertEqual(outbox.flush(), 2)
        self.assertEqual(made, ["first", "second"])

    def test_nothing_is_dropped_from_a_long_outbox(self):
        outbox = Outbox()
        with self.assertLogs("django_scheduling.runtime.outbox", "WARNING") as logs:
            for index in range(LONG_AFTER + 1):
                outbox.add(f"write {index}", lambda: None)
        self.assertEqual(len(outbox), LONG_AFTER + 1)
        self.assertIn(f"{LONG_AFTER} writes wait for the database", logs.output[0])
        self.assertEqual(outbox.flush(), LONG_AFTER + 1)


class OutboxReportTests(TransactionTestCase):
    def test_the_heartbeat_carries_the_outbox_figures_into_the_health_report(self):
        instances.beat(
            name="web-1:42:1",
            host="web-1",
            started_at=T0,
            now=datetime.now(UTC),
            using="default",
            outbox_pending=7,
            outbox_set_aside=2,
        )
        self.assertEqual(SchedulerInstance.objects.get().outbox_pending, 7)
        full = health.report(
            now=datetime.now(UTC),
            overdue_after=timedelta(minutes=5),
            heartbeat_interval=timedelta(seconds=30),
            using="default",
        )
        (instance,) = full["instances"]
        self.assertEqual((instance["outbox_pending"], instance["outbox_set_aside"]), (7, 2))
        self.assertNotIn("instances", health.public(full))
