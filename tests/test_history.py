"""History and task rows: pruning, lost runs, the overdue rule, and keeping rows in step."""

import re
import threading
from datetime import UTC, datetime, timedelta
from unittest import skipUnless
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.backends.signals import connection_created
from django.test import TestCase, TransactionTestCase, override_settings
from django.test.utils import CaptureQueriesContext

from django_scheduling.clock import utcnow
from django_scheduling.models import RunStatus, ScheduledTask, TaskLock, TaskRun
from django_scheduling.observability import monitoring
from django_scheduling.observability.events import run_events
from django_scheduling.observability.monitoring import TaskState
from django_scheduling.runtime import maintenance
from django_scheduling.runtime.service import SchedulerService
from django_scheduling.schedules.triggers import FixedRateTrigger, make_trigger
from django_scheduling.storage import history, task_rows
from django_scheduling.tasks import registry as registry_module
from django_scheduling.tasks.registry import TaskRegistry

from .processes import poll

NOW = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)


def run(task, started, status=RunStatus.SUCCEEDED, **fields):
    return TaskRun.objects.create(
        task_name=task, started_at=started, status=status, instance="host:1", **fields
    )


class PruneTests(TestCase):
    def test_prunes_old_finished_runs_in_batches(self):
        for minutes in range(7):
            run("old", NOW - timedelta(days=40, minutes=minutes))
        stuck = run("old", NOW - timedelta(days=40), RunStatus.RUNNING)
        recent = run("new", NOW - timedelta(days=1))
        deleted = history.prune(older_than=NOW - timedelta(days=30), using="default", batch_size=3)
        self.assertEqual(deleted, 7)
        self.assertEqual(set(TaskRun.objects.values_list("pk", flat=True)), {stuck.pk, recent.pk})

    def test_pruning_a_task_s_last_run_clears_the_link(self):
        old = run("job", NOW - timedelta(days=40))
        recent = run("other", NOW - timedelta(days=1))
        ScheduledTask.objects.create(
            name="job", kind="fixed_rate", trigger="every 1s", last_run=old
        )
        ScheduledTask.objects.create(
            name="other", kind="fixed_rate", trigger="every 1s", last_run=recent
        )
        history.prune(older_than=NOW - timedelta(days=30), using="default")
        self.assertIsNone(ScheduledTask.objects.get(name="job").last_run_id)
        self.assertEqual(ScheduledTask.objects.get(name="other").last_run_id, recent.pk)

    def test_pruning_clears_every_link_to_the_runs_it_deletes(self):
        lost = run("job", NOW - timedelta(days=40), RunStatus.LOST)
        recovery = run("job", NOW - timedelta(days=1), recovery_of=lost)
        ScheduledTask.objects.create(
            name="job", kind="fixed_rate", trigger="every 1s", last_run=lost, recover_run=lost
        )
        self.assertEqual(history.prune(older_than=NOW - timedelta(days=30), using="default"), 1)
        task = ScheduledTask.objects.get(name="job")
        self.assertEqual((task.last_run_id, task.recover_run_id), (None, None))
        recovery.refresh_from_db()
        self.assertIsNone(recovery.recovery_of_id)
        # A new link to a run must be cleared by prune() too.
        links = {
            (f.related_model.__name__, f.field.name)
            for f in TaskRun._meta.get_fields(include_hidden=True)
            if f.is_relation and f.auto_created and not f.concrete
        }
        self.assertEqual(
            links,
            {
                ("ScheduledTask", "last_run"),
                ("ScheduledTask", "recover_run"),
                ("TaskRun", "recovery_of"),
            },
        )

    def test_a_batch_is_pruned_by_id_without_loading_its_runs(self):
        # Django's delete() loaded every run of a batch whole (its output and traceback
        # too) to collect what points at it, then deleted 100 at a time: 15 statements a
        # batch of 1,000. A scheduler with its history on prunes at the rate it runs.
        for minutes in range(10):
            run("old", NOW - timedelta(days=40, minutes=minutes))
        with CaptureQueriesContext(connection) as queries:
            deleted = history.prune(
                older_than=NOW - timedelta(days=30), using="default", batch_size=5
            )
        self.assertEqual(deleted, 10)
        self.assertFalse(TaskRun.objects.exists())
        statements = [q["sql"].split()[0].upper() for q in queries.captured_queries]
        # Per batch: the ids, the tasks whose last run it holds (none here), two links
        # cleared, one delete; then the empty batch.
        self.assertEqual(statements.count("DELETE"), 2)
        self.assertEqual(statements.count("UPDATE"), 4)
        self.assertEqual(statements.count("SELECT"), 5)


class ForgetStartsTests(TestCase):
    def test_forgets_only_running_runs_and_clears_the_links_by_task_name(self):
        # The claim of "job" failed after its start was recorded (and its row pointed at it);
        # "done" ended already, and "other" points at a run of its own.
        forgotten = run("job", NOW, RunStatus.RUNNING)
        done = run("done", NOW)
        kept = run("other", NOW, RunStatus.RUNNING)
        for name, last in (("job", forgotten), ("other", kept)):
            ScheduledTask.objects.create(
                name=name, kind="fixed_rate", trigger="every 1s", last_run=last
            )
        with CaptureQueriesContext(connection) as queries:
            history.forget_starts(using="default", run_ids=[forgotten.pk, done.pk])
        self.assertEqual(set(TaskRun.objects.values_list("pk", flat=True)), {done.pk, kept.pk})
        self.assertIsNone(ScheduledTask.objects.get(name="job").last_run_id)
        self.assertEqual(ScheduledTask.objects.get(name="other").last_run_id, kept.pk)
        # ``last_run`` has no index: no task row is updated but by its name.
        table = ScheduledTask._meta.db_table
        updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
        for sql in updates:
            if table in sql.split("SET")[0] and "last_run_id" in sql.split("WHERE")[-1]:
                self.assertIn('"name" IN' if connection.vendor != "mysql" else "`name` IN", sql)


class RecordEndsTests(TestCase):
    def test_a_batch_of_ends_writes_each_run_its_own_values(self):
        # One statement per status and backend: each row must get its own times and result.
        at = datetime(2026, 5, 13, 12, 0, 0, 123456, tzinfo=UTC)
        starts = [history.Start(f"job{i}", at, at, None, 0, None) for i in range(10)]
        ids = history.record_starts(using="default", instance="a", started=at, runs=starts)
        ends = []
        for index, run_id in enumerate(ids):
            # The task began a little after its start was recorded (a worker took it); the
            # enqueues 3, 5 and 9 before it (claimed ahead, handed to the engine at once).
            early = index in (3, 5, 9)
            started = at + timedelta(milliseconds=-300 if early else index)
            finished = started + timedelta(seconds=index, microseconds=7)
            if index < 3:
                ends.append(history.Ended(run_id, RunStatus.SUCCEEDED, started, finished))
            elif index < 6:
                ends.append(
                    history.Ended(
                        run_id,
                        RunStatus.ENQUEUED,
                        started,
                        finished,
                        backend="default",
                        result_id=f"result-{index}",
                    )
                )
            else:  # with an error: written on its own; the last two failed to enqueue
                error = ("ValueError", f"bad {index}", "Traceback ...")
                backend = "default" if index >= 8 else ""
                ends.append(
                    history.Ended(
                        run_id, RunStatus.FAILED, started, finished, error, backend=backend
                    )
                )
        history.record_ends(using="default", ends=ends)
        found = {run.pk: run for run in TaskRun.objects.all()}
        for end in ends:
            run = found[end.run_id]
            # The start stays as recorded, unless an enqueue began before it; the duration is
            # the task's own.
            start = min(at, end.started) if end.backend else at
            self.assertEqual(
                (run.status, run.started_at, run.finished_at, run.duration),
                (end.status, start, end.finished, end.finished - end.started),
            )
            self.assertEqual((run.backend, run.result_id), (end.backend, end.result_id))
            self.assertEqual((run.error_type, run.error_message), end.error[:2])
        moved = [end for end in ends if found[end.run_id].started_at != at]
        self.assertEqual([ends.index(end) for end in moved], [3, 5, 9])

    @skipUnless(connection.vendor == "sqlite", "elsewhere the ends are one UPDATE of rows")
    def test_a_statement_binds_at_most_a_hundred_ends(self):
        # Django's SQLite cursor keeps every row of an executemany() until it returns (it peeks
        # at the first through itertools.tee), so the rows a statement binds are what the
        # writer holds at once: after a burst, thousands.
        at = datetime(2026, 5, 13, 12, 0, tzinfo=UTC)
        starts = [history.Start(f"job{i}", at, at, None, 0, None) for i in range(250)]
        ids = history.record_starts(using="default", instance="a", started=at, runs=starts)
        ends = [history.Ended(i, RunStatus.SUCCEEDED, at, at + MINUTE) for i in ids]
        bound = []

        def count(execute, sql, params, many, context):
            if many:
                params = list(params)
                bound.append(len(params))
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            history.record_ends(using="default", ends=ends)
        self.assertEqual(sum(bound), 250)
        self.assertLessEqual(max(bound), history.ENDS_PER_STATEMENT)
        self.assertEqual(
            TaskRun.objects.filter(status=RunStatus.SUCCEEDED, finished_at=at + MINUTE).count(),
            250,
        )


class LostRunTests(TestCase):
    """The lost-run rule. Lock expiry is judged by the database's clock, so lock times here
    are set relative to real time."""

    def lock(self, name, until, locked_at):
        TaskLock.objects.create(name=name, lock_until=until, locked_at=locked_at, locked_by="x")

    def test_a_running_run_whose_lock_expired_is_lost(self):
        now = utcnow()
        taken = now - 10 * MINUTE
        dead = run("dead", taken, RunStatus.RUNNING, locked_at=taken)
        self.lock("dead", now - MINUTE, taken)
        alive = run("alive", taken, RunStatus.RUNNING, locked_at=taken)
        self.lock("alive", now + MINUTE, taken)  # kept alive by its holder
        unlocked = run("unlocked", taken, RunStatus.RUNNING)  # lock=False task: no lock
        self.lock("unlocked", now - MINUTE, taken - MINUTE)  # left from when it had one
        lost = history.mark_lost_runs(now=now, using="default")
        self.assertEqual(lost, [(dead.pk, "dead", None)])
        dead.refresh_from_db()
        self.assertEqual(dead.status, RunStatus.LOST)
        self.assertEqual(dead.finished_at, now)
        self.assertIn("ended without recording a finish", dead.error_message)
        for other in (alive, unlocked):
            other.refresh_from_db()
            self.assertEqual(other.status, RunStatus.RUNNING)

    @pytest.mark.vendor("mysql")
    def test_lock_expiry_is_judged_in_utc_whatever_the_session_time_zone(self):
        # Django leaves a MySQL session in the server's time zone, where CURRENT_TIMESTAMP
        # (Django's Now()) is local time; the lock table holds UTC.
        for offset in ("+02:00", "-02:00"):
            with self.subTest(offset=offset), transaction.atomic():
                now = utcnow()
                taken = now - 10 * MINUTE
                dead = run("dead", taken, RunStatus.RUNNING, locked_at=taken)
                self.lock("dead", now - MINUTE, taken)
                alive = run("alive", taken, RunStatus.RUNNING, locked_at=taken)
                self.lock("alive", now + MINUTE, taken)
                with connection.cursor() as cursor:
                    cursor.execute("SET time_zone = %s", [offset])
                try:
                    lost = history.mark_lost_runs(now=now, using="default")
                finally:
                    with connection.cursor() as cursor:
                        cursor.execute("SET time_zone = DEFAULT")
                self.assertEqual(lost, [(dead.pk, "dead", None)])
                alive.refresh_from_db()
                self.assertEqual(alive.status, RunStatus.RUNNING)
                transaction.set_rollback(True)

    def test_a_run_whose_lock_was_taken_again_is_lost_while_the_lock_is_held(self):
        # A task that runs back to back: its killed holder's lock was taken by the next run at
        # once, so the lock has not been free at any housekeeping pass.
        now = utcnow()
        killed = run("busy", now - 2 * MINUTE, RunStatus.RUNNING, locked_at=now - 2 * MINUTE)
        current = run("busy", now - MINUTE, RunStatus.RUNNING, locked_at=now - MINUTE)
        self.lock("busy", now + 10 * MINUTE, now - MINUTE)
        self.assertEqual(
            history.mark_lost_runs(now=now, using="default"), [(killed.pk, "busy", None)]
        )
        current.refresh_from_db()
        self.assertEqual(current.status, RunStatus.RUNNING)

    def test_a_late_finish_of_a_lost_run_records_its_outcome(self):
        now = utcnow()
        frozen = run("job", now - 10 * MINUTE, RunStatus.RUNNING, locked_at=now - 10 * MINUTE)
        self.lock("job", now - MINUTE, now - 10 * MINUTE)
        history.mark_lost_runs(now=now, using="default")
        history.record_end(
            using="default",
            run_id=frozen.pk,
            status=RunStatus.SUCCEEDED,
            started=frozen.started_at,
            finished=now,
            lock_lost=True,
        )
        frozen.refresh_from_db()
        self.assertEqual((frozen.status, frozen.lock_lost), (RunStatus.SUCCEEDED, True))


class OverdueRuleTests(TestCase):
    """The overdue rule with explicit times, as the admin and ``scheduling_status`` apply it."""

    def task(self, name, next_fire_time, **fields):
        return ScheduledTask.objects.create(
            name=name, kind="cron", trigger="cron", next_fire_time=next_fire_time, **fields
        )

    def states(self, overdue_after):
        annotated = monitoring.annotate_state(
            ScheduledTask.objects.select_related("last_run"), now=NOW, overdue_after=overdue_after
        )
        return {task.name: TaskState(task.state) for task in annotated}

    @override_settings(TIME_ZONE="America/New_York")
    def test_states(self):
        self.task("late", NOW - 6 * MINUTE)
        self.task("a_little_late", NOW - 4 * MINUTE)
        self.task("started", NOW - 6 * MINUTE, last_fire_time=NOW - 6 * MINUTE)
        self.task("paused", NOW - 6 * MINUTE, paused=True)
        self.task("removed", NOW - 6 * MINUTE, removed_at=NOW)
        self.task("later", NOW + MINUTE)
        self.task("done", None)
        running = run("running", NOW - 2 * MINUTE, RunStatus.RUNNING)
        self.task("running", NOW + MINUTE, last_run=running, last_fire_time=NOW - 2 * MINUTE)
        self.assertEqual(
            self.states(overdue_after=5 * MINUTE),
            {
                "late": TaskState.OVERDUE,
                "a_little_late": TaskState.UPCOMING,
                "started": TaskState.UPCOMING,
                "paused": TaskState.PAUSED,
                "removed": TaskState.REMOVED,
                "later": TaskState.UPCOMING,
                "done": TaskState.DONE,
                "running": TaskState.RUNNING,
            },
        )
        overdue = monitoring.overdue_tasks(now=NOW, overdue_after=5 * MINUTE, using="default")
        self.assertEqual([(t.name, t.overdue_reason) for t in overdue], [("late", "not started")])

    def test_a_run_that_holds_its_task_past_the_next_fire_time_is_overdue_as_hung(self):
        hung = run("hung", NOW - 10 * MINUTE, RunStatus.RUNNING)
        self.task("hung", NOW - 6 * MINUTE, last_run=hung, last_fire_time=NOW - 10 * MINUTE)
        long = run("long", NOW - 10 * MINUTE, RunStatus.RUNNING)
        self.task("long", NOW - 4 * MINUTE, last_run=long, last_fire_time=NOW - 10 * MINUTE)
        self.assertEqual(
            self.states(overdue_after=5 * MINUTE),
            {"hung": TaskState.OVERDUE, "long": TaskState.RUNNING},
        )
        overdue = monitoring.overdue_tasks(now=NOW, overdue_after=5 * MINUTE, using="default")
        self.assertEqual([(t.name, t.overdue_reason) for t in overdue], [("hung", "hung")])

    def test_a_run_past_its_timeout_is_overdue_as_timed_out(self):
        timed_out = run("timed_out", NOW - 3 * MINUTE, RunStatus.RUNNING, timeout_at=NOW - MINUTE)
        # Its next fire time is still to come: the timeout alone makes it overdue.
        self.task("timed_out", NOW + MINUTE, last_run=timed_out, last_fire_time=NOW - 3 * MINUTE)
        within = run("within", NOW - 3 * MINUTE, RunStatus.RUNNING, timeout_at=NOW + MINUTE)
        self.task("within", NOW + MINUTE, last_run=within, last_fire_time=NOW - 3 * MINUTE)
        self.assertEqual(
            self.states(overdue_after=5 * MINUTE),
            {"timed_out": TaskState.OVERDUE, "within": TaskState.RUNNING},
        )
        overdue = monitoring.overdue_tasks(now=NOW, overdue_after=5 * MINUTE, using="default")
        self.assertEqual(
            [(t.name, t.overdue_reason) for t in overdue], [("timed_out", "timed out")]
        )

    def test_a_long_fixed_delay_run_is_late_only_past_its_timeout(self):
        # Its next fire time counts from the end of the run: while it runs, none has passed.
        for name, timeout_at in (("slow", None), ("stuck", NOW - MINUTE)):
            running = run(name, NOW - HOUR, RunStatus.RUNNING, timeout_at=timeout_at)
            ScheduledTask.objects.create(
                name=name,
                kind="fixed_delay",
                trigger="1m after each run",
                next_fire_time=NOW - 59 * MINUTE,
                last_fire_time=NOW - HOUR,
                last_run=running,
            )
        self.assertEqual(
            self.states(overdue_after=5 * MINUTE),
            {"slow": TaskState.RUNNING, "stuck": TaskState.OVERDUE},
        )


class SyncTests(TestCase):
    def test_rows_follow_the_code(self):
        rate = FixedRateTrigger(timedelta(seconds=30))
        task_rows.sync_tasks([("a", rate), ("b", rate)], now=NOW, using="default", complete=True)
        self.assertEqual(ScheduledTask.objects.get(name="a").anchor, NOW)
        self.assertEqual(ScheduledTask.objects.get(name="a").trigger, "every 30s")
        later = NOW + timedelta(hours=1)
        # "b" leaves the code, "a" keeps its trigger (and its anchor), "c" arrives.
        states = task_rows.sync_tasks(
            [("a", rate), ("c", rate)], now=later, using="default", complete=True
        )
        self.assertEqual(states["a"].anchor, NOW)
        self.assertEqual(ScheduledTask.objects.get(name="b").removed_at, later)
        self.assertIsNone(ScheduledTask.objects.get(name="c").removed_at)
        # A partial set (runscheduler --task a) marks nothing removed.
        task_rows.sync_tasks([("a", rate)], now=later, using="default", complete=False)
        self.assertIsNone(ScheduledTask.objects.get(name="c").removed_at)
        # "b" comes back; "a" changes its trigger: a new grid.
        faster = FixedRateTrigger(timedelta(seconds=5))
        task_rows.sync_tasks(
            [("a", faster), ("b", rate)], now=later, using="default", complete=True
        )
        a = ScheduledTask.objects.get(name="a")
        self.assertEqual((a.trigger, a.anchor), ("every 5s", later))
        self.assertIsNone(ScheduledTask.objects.get(name="b").removed_at)

    def test_cron_rows_describe_the_zone(self):
        trigger = make_trigger(cron="0 0 3 * * *", zone="Europe/Berlin")
        task_rows.sync_tasks([("nightly", trigger)], now=NOW, using="default", complete=False)
        self.assertEqual(
            ScheduledTask.objects.get(name="nightly").trigger, "cron 0 0 3 * * * Europe/Berlin"
        )

    def test_migrate_creates_the_rows_of_declared_tasks(self):
        saved = registry_module.registry
        self.addCleanup(setattr, registry_module, "registry", saved)
        registry_module.registry = TaskRegistry()
        registry_module.registry.add(lambda: None, cron="@daily", name="declared")
        call_command("migrate", verbosity=0)
        row = ScheduledTask.objects.get(name="declared")
        self.assertEqual(row.kind, "cron")
        self.assertEqual(row.trigger, f"cron @daily {ZoneInfo('UTC').key}")


class ServiceTests(TransactionTestCase):
    """A live in-process service: the admin's "run now" and the pool's rejections."""

    def test_run_now_is_picked_up_and_runs_through_the_normal_path(self):
        ran = threading.Event()
        definitions = TaskRegistry()
        definition = definitions.add(ran.set, fixed_rate="1h", initial_delay="1h", name="manual")
        service = SchedulerService([definition])
        service.start()
        self.addCleanup(service.stop, 5)
        ScheduledTask.objects.filter(name="manual").update(run_requested_at=datetime.now(UTC))
        self.assertTrue(ran.wait(15), "the run request was not picked up")
        finished = poll(
            lambda: TaskRun.objects.filter(task_name="manual", finished_at__isnull=False).first(),
            timeout=15,
        )
        self.assertIsNone(finished.scheduled_at)
        self.assertEqual(finished.status, RunStatus.SUCCEEDED)
        self.assertIsNone(ScheduledTask.objects.get(name="manual").run_requested_at)

    @override_settings(SCHEDULING={"CORE_POOL_SIZE": 1, "MAX_POOL_SIZE": 1, "QUEUE_CAPACITY": 0})
    def test_a_firing_the_pool_rejects_is_recorded_off_the_dispatcher_thread(self):
        threads = []

        def created(sender, connection, **kwargs):
            threads.append(threading.current_thread().name)

        connection_created.connect(created)
        self.addCleanup(connection_created.disconnect, created)
        busy, release = threading.Event(), threading.Event()
        self.addCleanup(release.set)

        def blocker():
            busy.set()
            release.wait(30)

        definitions = TaskRegistry()
        blocking = definitions.add(blocker, fixed_rate="1h", name="blocker")
        victim = definitions.add(lambda: None, fixed_rate="1s", name="victim")
        service = SchedulerService([blocking, victim])
        service.start()
        self.addCleanup(service.stop, 5)
        self.assertTrue(busy.wait(10))
        # The only worker is busy and the queue holds nothing: the pool rejects "victim".
        rejected = poll(
            lambda: TaskRun.objects.filter(task_name="victim", status=RunStatus.REJECTED).first(),
            timeout=15,
        )
        # The numbers of the pool, whether the blocker's thread had started yet or not.
        self.assertRegex(rejected.error_message, r"queue 0/0, threads (1/1|0/1, 1 more admitted)$")
        self.assertIsNotNone(rejected.scheduled_at)
        self.assertFalse([name for name in threads if "dispatcher" in name], threads)


class StopTests(TransactionTestCase):
    def test_a_second_stop_returns_once_the_first_has_written_its_records(self):
        """runserver's Ctrl-C stops the scheduler on a thread, then atexit calls stop() again:
        that call must not return (and let the process exit) halfway through the first."""
        started, release, workers = threading.Event(), threading.Event(), []

        def long() -> None:
            workers.append(threading.current_thread())
            started.set()
            release.wait(30)

        definitions = TaskRegistry()
        definition = definitions.add(long, fixed_rate="1h", name="long")
        service = SchedulerService([definition])
        service.start()
        self.addCleanup(self.end_the_task, release, workers)
        self.addCleanup(service.stop, 5)
        self.assertTrue(started.wait(15))
        assert service.pipeline is not None
        marking, mark = threading.Event(), service.pipeline.interrupted

        def slow_marking(names: list[str]) -> None:
            marking.set()
            threading.Event().wait(2)  # the first stop is slow to write its records
            mark(names)

        service.pipeline.interrupted = slow_marking  # type: ignore[method-assign]
        first = threading.Thread(target=service.stop, args=(0.0,))
        first.start()
        self.addCleanup(first.join, 30)
        self.assertTrue(marking.wait(15))
        service.stop(0.0)
        # The first stop marked the run interrupted before the second returned.
        self.assertEqual(TaskRun.objects.get(task_name="long").status, RunStatus.INTERRUPTED)

    def end_the_task(self, release: threading.Event, workers: list[threading.Thread]) -> None:
        """Let the task return, and its end and signals go out, before the next test: a run
        ending 30 s later sent its run_succeeded to another test's receivers."""
        release.set()
        for worker in workers:
            worker.join(10)
        self.assertTrue(run_events.drain(10))

    def test_a_start_that_a_stop_gave_up_waiting_for_stops_once_it_is_done(self):
        """A stop waits for a start under way only as long as the shutdown may take; the
        start must not then go on and fire tasks in a process that has stopped."""
        definitions = TaskRegistry()
        definition = definitions.add(lambda: None, fixed_rate="1h", name="after-stop")
        service = SchedulerService([definition])
        self.addCleanup(service.stop, 5)
        starting, go_on, real_start = threading.Event(), threading.Event(), service._start

        def slow_start() -> None:
            starting.set()
            go_on.wait(30)  # a database slow to answer at start-up
            real_start()

        service._start = slow_start  # type: ignore[method-assign]
        start = threading.Thread(target=service.start)
        start.start()
        self.addCleanup(start.join, 30)
        self.assertTrue(starting.wait(15))
        self.assertEqual(service.stop(0.1), [])  # gave up waiting for the start
        shutting, finish, real_shut = threading.Event(), threading.Event(), service._shut

        def slow_shut(wait: float) -> list[str]:
            shutting.set()
            finish.wait(30)  # the late stop is slow to write its records
            return real_shut(wait)

        service._shut = slow_shut  # type: ignore[method-assign]
        go_on.set()
        self.assertTrue(shutting.wait(15))
        # atexit's stop() must wait for the late stop, or the process exits halfway through.
        second = threading.Thread(target=service.stop, args=(0.1,))
        second.start()
        self.addCleanup(second.join, 30)
        second.join(0.5)
        self.assertTrue(second.is_alive())
        finish.set()
        second.join(30)
        start.join(30)
        assert service.scheduler is not None
        self.assertTrue(service.scheduler.stopping)
        assert service.writer is not None and service.keepalive is not None
        self.assertFalse(service.keepalive._thread.is_alive())


class HousekeepingServiceTests(TransactionTestCase):
    def test_a_running_service_prunes_and_marks_lost_runs(self):
        now = datetime.now(UTC)
        old = run("gone", now - timedelta(days=31))
        dead = run("dead", now - 10 * MINUTE, RunStatus.RUNNING, locked_at=now - 10 * MINUTE)
        TaskLock.objects.create(
            name="dead", lock_until=now - MINUTE, locked_at=now - 10 * MINUTE, locked_by="x"
        )
        definitions = TaskRegistry()
        definition = definitions.add(lambda: None, fixed_rate="1h", initial_delay="1h", name="t")
        service = SchedulerService([definition])
        service.start()
        self.addCleanup(service.stop, 5)
        poll(lambda: not TaskRun.objects.filter(pk=old.pk).exists(), timeout=15)
        dead.refresh_from_db()
        poll(lambda: TaskRun.objects.get(pk=dead.pk).status == RunStatus.LOST, timeout=15)


class RequestPollTests(TransactionTestCase):
    def test_the_poll_for_run_requests_searches_indexes_not_the_table(self):
        """Every instance polls for "run now" and recoveries every second: with 10,000 tasks
        it must not read every row (nor, on SQLite, keep them all in its page cache)."""
        now = datetime.now(UTC)
        ScheduledTask.objects.bulk_create(
            ScheduledTask(name=f"poll.{index:05d}", kind="cron", trigger="cron @daily UTC")
            for index in range(10_000)
        )
        ScheduledTask.objects.filter(name="poll.00042").update(run_requested_at=now)
        lost = run("poll.00077", now - MINUTE, RunStatus.LOST)
        ScheduledTask.objects.filter(name="poll.00077").update(recover_run=lost)
        table = ScheduledTask._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {'TABLE ' if connection.vendor == 'mysql' else ''}{table}")
        rows = maintenance.requested_runs(using="default")
        self.assertCountEqual(
            list(rows), [("poll.00042", now, None), ("poll.00077", None, lost.pk)]
        )
        plan = rows.explain()
        full_scan = {
            "sqlite": rf"SCAN {table}$",
            "postgresql": "Seq Scan",
            "mysql": rf"\b{table} ALL\b",
        }[connection.vendor]
        self.assertNotRegex(plan, re.compile(full_scan, re.MULTILINE), plan)
