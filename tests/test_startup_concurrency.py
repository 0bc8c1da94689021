"""Instances that start at the same moment on one database all start.

Their start-ups write the same rows of the task table at once; a deadlock or a serialization
failure between them is no outage and must not keep one of them from starting.
"""

from __future__ import annotations

import gc
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import TransactionTestCase
from django.utils import timezone

from django_scheduling.conf import SchedulingSettings
from django_scheduling.models import ScheduledTask
from django_scheduling.runtime.service import SchedulerService
from django_scheduling.storage import task_rows
from django_scheduling.tasks.registry import TaskRegistry

from .processes import poll

DEADLINE = 120.0
T0 = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)


def job() -> None:
    pass


def definitions(registry: TaskRegistry, prefix: str, count: int) -> list:
    """*count* tasks that fire every second: the instances that have started claim their
    rows (locking them in the order of their names) while the others still write them.

    Declared in the reverse order of their names: a start-up that stored and locked the rows
    in the order it is given them, not by name, would meet the claims head-on.
    """
    return [
        registry.add(job, name=f"{prefix}.task{index:05}", cron="* * * * * *")
        for index in reversed(range(count))
    ]


def service_of(tasks: list) -> SchedulerService:
    conf = SchedulingSettings.from_dict({"HISTORY": False})
    return SchedulerService(tasks, tasks=TaskRegistry(), conf=conf)


def wait_for_other_sessions_to_end() -> None:
    """Wait until the connections of the stopped services' threads are closed (they close
    when the threads' objects are collected), so that the test database can be dropped."""
    if connection.vendor != "postgresql":
        return

    def others() -> list[tuple]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, client_port, backend_start, state, left(query, 120) "
                "FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return cursor.fetchall()

    def alone() -> bool:
        gc.collect()
        return not others()

    try:
        poll(alone, timeout=DEADLINE)
    except AssertionError:
        threads = sorted(thread.name for thread in threading.enumerate())
        raise AssertionError(
            f"the stopped services' connections stayed open: {others()}; threads: {threads}"
        ) from None


@pytest.mark.vendor("postgresql", "mysql")
# Under Django 6.1 only: among the suite's slowest tests, about the database, not Django.
@pytest.mark.sessions("6.1")
class ConcurrentStartUpTests(TransactionTestCase):
    def start_together(self, services: list[SchedulerService]) -> list[BaseException]:
        """Start *services* on threads of their own (each with its own connection), all at
        once; return what their start-ups raised."""
        barrier = threading.Barrier(len(services), timeout=DEADLINE)
        failures: list[BaseException] = []

        def start(service: SchedulerService) -> None:
            try:
                barrier.wait()
                service.start()
            except BaseException as exc:  # reported by the test
                failures.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=start, args=(s,)) for s in services]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
            self.assertFalse(thread.is_alive(), "a start-up did not end in time")
        return failures

    def test_instances_starting_together_on_many_new_tasks_all_start(self):
        """Three instances start at once on new tasks; then, while they fire every second
        (claiming their rows), three more start on the same rows."""
        for round_ in range(2):
            with self.subTest(round=round_):
                registry = TaskRegistry()
                tasks = definitions(registry, f"round{round_}", 1000)
                services = [service_of(tasks) for _ in range(6)]
                for service in services:
                    self.addCleanup(service.stop, 5)
                self.assertEqual(self.start_together(services[:3]), [])
                poll(
                    lambda: ScheduledTask.objects.exclude(last_fire_time=None).exists(),
                    timeout=DEADLINE,
                    message="the instances never claimed a fire time",
                )
                self.assertEqual(self.start_together(services[3:]), [])
                for service in services:
                    self.assertEqual(len(service.next_fire_times()), 1000)
                    service.stop(5)
                self.assertEqual(ScheduledTask.objects.filter(removed_at=None).count(), 1000)
                ScheduledTask.objects.all().delete()
                wait_for_other_sessions_to_end()


class StartUpThread(threading.Thread):
    """Start a service on a thread of its own, with its own connection."""

    def __init__(self, service: SchedulerService) -> None:
        super().__init__(name="start-up")
        self.service = service
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self.service.start()
        except BaseException as exc:  # reported by the test
            self.failure = exc
        finally:
            connections.close_all()


@pytest.mark.vendor("postgresql")
class RowLockOrderTests(TransactionTestCase):
    """The start-up's writes lock a real PostgreSQL server's rows, with another transaction
    holding some of them."""

    def setUp(self) -> None:
        # Yearly tasks: one next fire time for all, one UPDATE for their rows at start-up.
        registry = TaskRegistry()
        self.tasks = [
            registry.add(job, name=f"yearly.task{index:03}", cron="0 0 1 1 *")
            for index in range(400)
        ]
        zone = timezone.get_default_timezone()
        # Stored in the reverse order of their names, as an instance of another deployment
        # may have left them: a scan of the table meets them last name first.
        for definition in reversed(self.tasks):
            task_rows.sync_tasks(
                [(definition.name, definition.trigger(zone))],
                now=timezone.now(),
                using="default",
                complete=False,
            )
        self.first, self.last = self.tasks[0].name, self.tasks[-1].name
        self.service = service_of(self.tasks)
        self.addCleanup(wait_for_other_sessions_to_end)
        self.addCleanup(self.service.stop, 5)

    def lock_row(self, name: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT name FROM django_scheduling_scheduledtask WHERE name = %s FOR UPDATE",
                [name],
            )

    def wait_until_the_start_up_waits_for_a_row(self) -> None:
        def waiting() -> bool:
            # This database's sessions only: the server may serve other test runs at once.
            # (In the test's transaction, pg_stat_activity is a snapshot until cleared.)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT count(*) FROM pg_locks JOIN pg_stat_activity USING (pid) "
                    "WHERE NOT granted AND datname = current_database()"
                )
                return cursor.fetchone()[0] > 0

        poll(waiting, timeout=DEADLINE, message="the start-up never waited for a row")

    def start_against(self, first: str, then: str) -> StartUpThread:
        """Hold the row of *first* in a transaction while the service starts, and the row of
        *then* once the start-up waits for one; commit; return the ended start-up."""
        thread = StartUpThread(self.service)
        with transaction.atomic():
            self.lock_row(first)
            thread.start()
            self.wait_until_the_start_up_waits_for_a_row()
            self.lock_row(then)
        thread.join(DEADLINE)
        self.assertFalse(thread.is_alive(), "the start-up did not end in time")
        return thread

    def test_the_start_up_locks_rows_in_the_order_of_their_names(self):
        """A transaction that locks rows by name (as claims do) meets no deadlock with it."""
        with self.assertNoLogs("django_scheduling.runtime.service", "WARNING"):
            thread = self.start_against(self.first, then=self.last)
        self.assertIsNone(thread.failure)
        self.assertEqual(len(self.service.next_fire_times()), len(self.tasks))
        self.assertEqual(ScheduledTask.objects.filter(next_fire_time=None).count(), 0)

    def test_a_deadlock_during_start_up_is_retried(self):
        """A transaction that locks rows in the opposite order deadlocks with the start-up's
        first write, which the database rolls back: the start-up writes again and starts."""
        with self.assertLogs("django_scheduling.runtime.service", "INFO") as logs:
            thread = self.start_against(self.last, then=self.first)
        self.assertIsNone(thread.failure)
        retries = [line for line in logs.output if "trying again" in line]
        self.assertEqual(len(retries), 1, logs.output)
        self.assertIn("publishing the next fire times met another instance's writes", retries[0])
        self.assertIn("deadlock detected", retries[0])
        self.assertEqual(len(self.service.next_fire_times()), len(self.tasks))
        self.assertEqual(ScheduledTask.objects.filter(next_fire_time=None).count(), 0)


class PublishTests(TransactionTestCase):
    """``publish_next_fire_times`` writes each row's time, in both of its shapes."""

    def setUp(self) -> None:
        ScheduledTask.objects.bulk_create(
            [ScheduledTask(name=f"t{i}", kind="cron", trigger="x") for i in range(40)]
        )

    def stored(self) -> dict[str, datetime | None]:
        return dict(ScheduledTask.objects.values_list("name", "next_fire_time"))

    def test_distinct_times(self):
        times = {f"t{i}": T0 + timedelta(seconds=i) for i in range(39)} | {"t39": None}
        task_rows.publish_next_fire_times(times, using="default")
        self.assertEqual(self.stored(), times)

    def test_shared_times(self):
        times = {f"t{i}": T0 if i % 20 else None for i in range(40)}
        task_rows.publish_next_fire_times(times, using="default")
        self.assertEqual(self.stored(), times)
