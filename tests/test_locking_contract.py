"""The lock provider contract (ShedLock's integration tests, see lock_behaviours.md) run against
every provider, then what only the database provider promises.

Item numbers (A1, B5, ...) refer to the checklist. Expiry tests wait for real on the database
(tens to hundreds of milliseconds) and move a fake clock for the in-memory provider.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DataError, connection, connections, transaction
from django.test import SimpleTestCase, TransactionTestCase, override_settings

from django_scheduling.locking import (
    DatabaseLockProvider,
    InMemoryLockProvider,
    InvalidLockHandle,
    Lock,
    LockConfiguration,
    LockError,
    LockProvider,
    get_lock_provider,
)
from django_scheduling.models import TaskLock, TaskRun

from .locking_helpers import FakeClock, extra_database, fuzz, wait_until
from .processes import database_url, skewed

VENDOR = connection.vendor
MYSQL = VENDOR == "mysql"
SERVER = VENDOR in ("mysql", "postgresql")  # a database server with its own clock
INVALID = "is no longer valid: it was already unlocked or extended"


class LockProviderContract:
    """What every provider does. Subclasses say how to build one and how to read its table."""

    provider: LockProvider
    fuzz_iterations = 100

    def make_provider(self, owner: str | None = None) -> Any:
        raise NotImplementedError

    def realtime_provider(self) -> Any:
        return self.make_provider()

    def wait(self, seconds: float) -> None:
        raise NotImplementedError

    def stored_lock_until(self, name: str) -> datetime | None:
        raise NotImplementedError

    def storage_now(self) -> datetime:
        raise NotImplementedError

    def is_locked(self, name: str) -> bool:
        until = self.stored_lock_until(name)
        self.assertIsNotNone(until, f"no row for {name!r}")  # unlocked is not deleted
        return until > self.storage_now()

    def setUp(self) -> None:
        super().setUp()
        self.name = str(uuid.uuid4())
        self.provider = self.make_provider()

    def config(self, most: Any = "5m", least: Any = 0, name: str | None = None) -> Any:
        return LockConfiguration(name or self.name, most, least)

    def take(self, *args: Any, **kwargs: Any) -> Lock:
        lock = self.provider.lock(self.config(*args, **kwargs))
        self.assertIsNotNone(lock)
        assert lock is not None
        return lock

    # -- A: every provider ----------------------------------------------------------------------

    def test_lock_returns_a_single_use_handle(self) -> None:
        """The protocol's promise, through a real call: a ``Lock``, or ``None`` when held."""
        provider: LockProvider = self.provider
        lock = provider.lock(self.config())
        self.assertIsInstance(lock, Lock)
        self.assertEqual(lock.config, self.config())
        self.assertIsNone(provider.lock(self.config()))
        self.assertIs(lock.unlock(), True)
        self.assertFalse(lock.valid)

    def test_lock_then_unlock(self) -> None:
        """A1."""
        lock = self.take()
        self.assertTrue(self.is_locked(self.name))
        self.assertIs(lock.unlock(), True)
        self.assertFalse(self.is_locked(self.name))

    def test_second_lock_is_refused_while_held(self) -> None:
        """A2: refusal is None, not an exception."""
        lock = self.take()
        self.assertIsNone(self.provider.lock(self.config()))
        self.assertIsNone(self.make_provider("another-instance").lock(self.config()))
        lock.unlock()

    def test_different_names_are_independent(self) -> None:
        """A3."""
        first, second = self.take(), self.take(name="name2")
        first.unlock()
        second.unlock()

    def test_lock_twice_in_a_row(self) -> None:
        """A4: unlock with lock_at_least_for = 0 frees the lock at once."""
        self.take().unlock()
        self.take().unlock()

    def test_expired_lock_can_be_taken_over(self) -> None:
        """A5: a lock never unlocked is free after lock_at_most_for."""
        self.take("50ms")
        self.wait(0.1)
        self.assertFalse(self.is_locked(self.name))
        self.make_provider("another-instance").lock(self.config("50ms")).unlock()

    def test_relock_right_after_unlock_with_the_same_config(self) -> None:
        """A6."""
        config = self.config()
        for _ in range(10):
            lock = self.provider.lock(config)
            self.assertIsNotNone(lock)
            self.assertIsNone(self.provider.lock(config))
            lock.unlock()

    def test_fuzz(self) -> None:
        """A7: mutual exclusion under concurrency loses no update."""
        counters = fuzz(self.realtime_provider, iterations=self.fuzz_iterations)
        self.assertEqual(counters, self.fuzz_expected())

    def fuzz_expected(self) -> dict[str, int]:
        """Return ShedLock's {"lock1": 310, "lock2": 400} for 100 iterations."""
        n = self.fuzz_iterations
        return {"lock1": 3 * n + n // 10, "lock2": 4 * n}

    def test_unlock_honours_lock_at_least_for(self) -> None:
        """A8: an early unlock keeps the lock until locked_at + lock_at_least_for, exactly."""
        lock = self.take("2h", "1h")
        self.assertIs(lock.unlock(), True)
        self.assertEqual(self.stored_lock_until(self.name), lock.locked_at + timedelta(hours=1))
        self.assertIsNone(self.provider.lock(self.config()))
        self.assertIsNone(self.make_provider("another-instance").lock(self.config()))

    def test_lock_is_free_once_lock_at_least_for_has_passed(self) -> None:
        """A8: when the storage clock passes the kept expiry, the lock can be taken again."""
        lock = self.take("1m", "100ms")
        lock.unlock()
        until = self.stored_lock_until(self.name)
        self.assertGreaterEqual(until, lock.locked_at + timedelta(milliseconds=100))
        self.wait_for_storage_clock(until)
        self.take().unlock()

    def test_zero_lock_at_most_for_is_free_at_once(self) -> None:
        """A lock expiring exactly now can be taken over (acquire compares with <=)."""
        self.assertIsNotNone(self.take(0))
        self.assertIsNotNone(self.make_provider("another-instance").lock(self.config(0)))

    def test_handle_attributes(self) -> None:
        lock = self.take("1m", "10s")
        self.assertEqual(lock.config, self.config("1m", "10s"))
        self.assertEqual(lock.locked_at.utcoffset(), timedelta(0))
        self.assertEqual(lock.lock_until, lock.locked_at + timedelta(minutes=1))
        self.assertEqual(self.stored_lock_until(self.name), lock.lock_until)
        self.assertTrue(lock.valid)
        lock.unlock()
        self.assertFalse(lock.valid)

    # -- B: extend ------------------------------------------------------------------------------

    def test_extend_moves_the_expiry(self) -> None:
        """B1."""
        lock = self.take("1m")
        extended = lock.extend("2h")
        self.assertIsNotNone(extended)
        self.assertEqual(extended.locked_at, lock.locked_at)
        self.assertGreater(extended.lock_until, lock.lock_until + timedelta(minutes=59))
        self.assertEqual(self.stored_lock_until(self.name), extended.lock_until)
        self.assertIs(extended.unlock(), True)
        self.assertFalse(self.is_locked(self.name))

    def test_extend_several_times(self) -> None:
        """B2: each extend works on the handle the previous one returned."""
        lock = self.take("1m")
        for hours in (2, 4, 6):
            previous, lock = lock, lock.extend(f"{hours}h")
            self.assertIsNotNone(lock)
            self.assertGreater(lock.lock_until, previous.lock_until + timedelta(minutes=90))
        self.assertEqual(self.stored_lock_until(self.name), lock.lock_until)
        self.assertIs(lock.unlock(), True)
        self.assertFalse(self.is_locked(self.name))

    def test_unlocked_handle_cannot_be_extended(self) -> None:
        """B3."""
        lock = self.take("2s")
        lock.unlock()
        self.assertFalse(self.is_locked(self.name))
        with self.assertRaisesMessage(InvalidLockHandle, f"lock {self.name!r} {INVALID}"):
            lock.extend("10s")

    def test_expired_lock_cannot_be_extended(self) -> None:
        """B4: the storage refuses, lock_until does not move, and the handle is spent."""
        lock = self.take("20ms")
        self.wait(0.05)
        self.assertIsNone(lock.extend("10s"))
        self.assertFalse(self.is_locked(self.name))
        self.assertEqual(self.stored_lock_until(self.name), lock.lock_until)
        with self.assertRaisesMessage(InvalidLockHandle, INVALID):
            lock.unlock()

    def test_unlock_after_extend_counts_least_from_the_extend(self) -> None:
        """B5."""
        self.take("10s").extend("10s", "9s").unlock()
        self.assertTrue(self.is_locked(self.name))

    def test_original_handle_cannot_be_extended_again(self) -> None:
        """B6."""
        lock = self.take("10s")
        self.assertIsNotNone(lock.extend("10s", "9s"))
        with self.assertRaisesMessage(InvalidLockHandle, INVALID):
            lock.extend("10s", "9s")

    def test_original_handle_cannot_be_unlocked_after_extend(self) -> None:
        """B7."""
        lock = self.take("10s")
        lock.extend("10s", "9s")
        with self.assertRaisesMessage(InvalidLockHandle, INVALID):
            lock.unlock()

    def test_unlock_twice_raises(self) -> None:
        lock = self.take()
        lock.unlock()
        with self.assertRaisesMessage(InvalidLockHandle, INVALID):
            lock.unlock()

    def test_invalid_extend_arguments_leave_the_handle_usable(self) -> None:
        lock = self.take()
        with self.assertRaisesMessage(ValueError, "exceeds lock_at_most_for"):
            lock.extend("1s", "2s")
        self.assertTrue(lock.valid)
        lock.unlock()

    # -- only the holder ------------------------------------------------------------------------

    def test_stale_handle_cannot_release_or_extend_another_owners_lock(self) -> None:
        stale = self.take("50ms")
        stale_too = self.take("50ms", name="name2")
        self.wait(0.1)
        other = self.make_provider("another-instance")
        held = other.lock(self.config("10s"))
        held_too = other.lock(self.config("10s", name="name2"))
        with self.assertLogs(self.logger_name, "WARNING") as logs:
            self.assertIs(stale.unlock(), False)
        self.assertIn(f"Lock {self.name!r} was no longer held", logs.output[0])
        self.assertIsNone(stale_too.extend("1m"))
        self.assertEqual(self.stored_lock_until(self.name), held.lock_until)
        self.assertEqual(self.stored_lock_until("name2"), held_too.lock_until)
        self.assertIsNone(self.provider.lock(self.config()))

    def test_stale_handle_cannot_release_a_newer_lock_of_the_same_owner(self) -> None:
        stale = self.take("50ms")
        self.wait(0.1)
        newer = self.take("10s")
        with self.assertLogs(self.logger_name, "WARNING"):
            self.assertIs(stale.unlock(), False)
        self.assertEqual(self.stored_lock_until(self.name), newer.lock_until)
        self.assertIsNone(self.make_provider("another-instance").lock(self.config()))

    def test_unlock_of_an_expired_lock_nobody_took_releases_it(self) -> None:
        lock = self.take("20ms")
        self.wait(0.05)
        with self.assertNoLogs(self.logger_name, "WARNING"):
            self.assertIs(lock.unlock(), True)
        self.take().unlock()

    # -- E: keyed by name -----------------------------------------------------------------------

    def test_refused_lock_leaves_lock_until_alone(self) -> None:
        """E1."""
        lock = self.take("10s")
        self.assertIsNone(self.make_provider("another-instance").lock(self.config("10s")))
        self.assertEqual(self.stored_lock_until(self.name), lock.lock_until)

    def test_lock_only_touches_its_own_name(self) -> None:
        """E2."""
        mine, other = self.take("10ms"), self.take("10ms", name="other-lock")
        self.wait(0.03)
        again = self.take("10ms")
        self.assertGreater(again.lock_until, mine.lock_until)
        self.assertEqual(self.stored_lock_until(self.name), again.lock_until)
        self.assertEqual(self.stored_lock_until("other-lock"), other.lock_until)


class InMemoryLockProviderTests(LockProviderContract, SimpleTestCase):
    def make_provider(self, owner: str | None = None) -> InMemoryLockProvider:
        if not hasattr(self, "base"):
            self.clock = FakeClock()
            self.base = InMemoryLockProvider(owner="tests", clock=self.clock)
        return self.base.with_owner(owner) if owner else self.base

    def realtime_provider(self) -> InMemoryLockProvider:
        if not hasattr(self, "realtime"):
            self.realtime = InMemoryLockProvider()
        return self.realtime

    logger_name = "django_scheduling.locking.memory"

    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def wait_for_storage_clock(self, moment: datetime) -> None:
        self.clock.now = max(self.clock.now, moment)

    def stored_lock_until(self, name: str) -> datetime | None:
        row = self.base._rows.get(name)
        return row and row.lock_until

    def storage_now(self) -> datetime:
        return self.clock()

    def test_owner_defaults_to_the_instance_name(self) -> None:
        with override_settings(SCHEDULING={"INSTANCE_NAME": "web-1"}):
            self.assertEqual(InMemoryLockProvider().owner, "web-1")


class LockProviderSettingTests(SimpleTestCase):
    def test_database_provider_by_default(self) -> None:
        provider = get_lock_provider()
        self.assertIsInstance(provider, DatabaseLockProvider)
        self.assertIs(get_lock_provider(), provider)

    def test_memory_provider_is_a_process_wide_singleton(self) -> None:
        with override_settings(SCHEDULING={"LOCK_PROVIDER": "memory"}):
            provider = get_lock_provider()
            self.assertIsInstance(provider, InMemoryLockProvider)
            self.assertIs(get_lock_provider(), provider)
        self.assertIsInstance(get_lock_provider(), DatabaseLockProvider)


TABLE = TaskLock._meta.db_table
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BROKEN = {"HOST": "127.0.0.1", "PORT": 1} if SERVER else {"NAME": "/nonexistent-dir/db.sqlite3"}


def storage_now(conn: Any = connection) -> datetime:
    """Return "now" by the clock the provider uses: the server's on MySQL and PostgreSQL."""
    if conn.vendor == "sqlite":
        return datetime.now(UTC)
    with conn.cursor() as cursor:
        cursor.execute("SELECT now()" if conn.vendor == "postgresql" else "SELECT UTC_TIMESTAMP(6)")
        return cursor.fetchone()[0].replace(tzinfo=UTC)


def locked_on(conn: Any, name: str) -> bool:
    """Return whether *conn* sees *name* locked (read with plain SQL, outside the ORM)."""
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT lock_until FROM {TABLE} WHERE name = %s", [name])
        (until,) = cursor.fetchone()
    until = datetime.fromisoformat(until) if isinstance(until, str) else until
    return until.replace(tzinfo=UTC) > storage_now(conn)


@contextmanager
def statements(conn: Any = connection) -> Iterator[list[str]]:
    """Record the verb of every statement run on *conn*, failed ones included."""
    seen: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql.split(None, 1)[0].upper())
        return execute(sql, params, many, context)

    with conn.execute_wrapper(record):
        yield seen


def now_plus(**kwargs: float) -> datetime:
    return datetime.now(UTC) + timedelta(**kwargs)


def run_helper(args: list[str], **env: str) -> str:
    """Run ``python -m tests.locking_helpers ARGS`` on the test database; return its output."""
    environment = {**os.environ, "DATABASE_URL": database_url()}
    if "FAKETIME" in env:
        environment.update(skewed(env.pop("FAKETIME")))
    environment.update(env)
    done = subprocess.run(
        [sys.executable, "-m", "tests.locking_helpers", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise AssertionError(f"tests.locking_helpers {args} failed:\n{done.stderr}")
    return done.stdout


class DatabaseLockProviderTests(LockProviderContract, TransactionTestCase):
    databases = {"default"}
    # SQLite has one writer and its busy handler backs off for milliseconds: fewer iterations.
    fuzz_iterations = 100 if SERVER else 30
    logger_name = "django_scheduling.locking.database"

    def make_provider(self, owner: str | None = None) -> DatabaseLockProvider:
        return DatabaseLockProvider(owner=owner)

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait_for_storage_clock(self, moment: datetime) -> None:
        wait_until(lambda: storage_now() >= moment, f"the storage clock reaches {moment}")

    def stored_lock_until(self, name: str) -> datetime | None:
        return TaskLock.objects.filter(name=name).values_list("lock_until", flat=True).first()

    def storage_now(self) -> datetime:
        return storage_now()

    def count(self, statements: list[str], verb: str) -> int:
        return statements.count(verb)

    def in_transaction(self, alias: str, *, write: bool) -> Any:
        """Return a factory of outer transactions on *alias*, rolled back at the end."""

        class Outer:
            def __enter__(self) -> None:
                self.atomic = transaction.atomic(using=alias)
                self.atomic.__enter__()
                if write:
                    TaskRun.objects.using(alias).create(
                        task_name="outer", started_at=now_plus(), status="running", instance="t"
                    )

            def __exit__(self, *exc_info: Any) -> None:
                transaction.set_rollback(True, using=alias)
                self.atomic.__exit__(*exc_info)

        return Outer

    # -- C, F: the cache of known rows ----------------------------------------------------------

    @pytest.mark.vendor("postgresql")
    def test_postgresql_takes_a_lock_in_one_statement(self) -> None:
        """INSERT ... ON CONFLICT DO UPDATE: one statement for a new, a free and a held lock."""
        for case in ("new", "free", "held"):
            with self.subTest(case), statements() as taking:
                lock = self.provider.lock(self.config())
            self.assertEqual((self.count(taking, "INSERT"), len(self.dml(taking))), (1, 1))
            self.assertEqual(lock is None, case == "held")
            if case == "free":
                continue  # keep it: the next lock finds it held
            if lock is not None:
                with statements() as unlocking:
                    lock.unlock()
                self.assertEqual(self.dml(unlocking), ["UPDATE"])

    def dml(self, verbs: list[str]) -> list[str]:
        """Return the statements that read or write rows, without transaction control."""
        return [verb for verb in verbs if verb in ("INSERT", "UPDATE", "SELECT", "DELETE")]

    @pytest.mark.vendor("mysql", "sqlite")
    def test_known_names_skip_the_insert(self) -> None:
        """F4, F5, E8: a new name costs one INSERT, a known one one UPDATE; unlock one UPDATE."""
        with statements() as first:
            lock = self.provider.lock(self.config())
        self.assertEqual((self.count(first, "INSERT"), self.count(first, "UPDATE")), (1, 0))
        with statements() as unlocking:
            lock.unlock()
        self.assertEqual((self.count(unlocking, "INSERT"), self.count(unlocking, "UPDATE")), (0, 1))
        with statements() as again:
            self.provider.lock(self.config()).unlock()
        self.assertEqual((self.count(again, "INSERT"), self.count(again, "UPDATE")), (0, 2))
        fresh = self.make_provider()
        with statements() as existing:
            fresh.lock(self.config()).unlock()
        self.assertEqual((self.count(existing, "INSERT"), self.count(existing, "UPDATE")), (1, 2))

    def test_held_lock_survives_clearing_the_cache(self) -> None:
        """C1: the INSERT hits the duplicate key and the UPDATE does not apply."""
        lock = self.take()
        self.provider.clear_cache()
        self.assertIsNone(self.provider.lock(self.config()))
        lock.unlock()

    def test_unlocked_lock_survives_clearing_the_cache(self) -> None:
        """C2: the duplicate key falls through to an UPDATE that succeeds."""
        self.take().unlock()
        self.provider.clear_cache()
        self.take().unlock()

    def test_failed_update_forgets_the_row(self) -> None:
        """F9: when the UPDATE raises, both calls raise LockError and both try the INSERT."""
        TaskLock.objects.create(
            name="f9", lock_until=now_plus(), locked_at=now_plus(), locked_by="someone"
        )
        drop = "DROP TRIGGER refuse_update"
        if MYSQL:
            body = "FOR EACH ROW BEGIN IF NEW.name = 'f9' THEN SIGNAL SQLSTATE '45000' "
            body += "SET MESSAGE_TEXT = 'update refused'; END IF; END"
        elif VENDOR == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "CREATE FUNCTION refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$ "
                    "BEGIN IF NEW.name = 'f9' THEN RAISE EXCEPTION 'update refused'; END IF; "
                    "RETURN NEW; END $$"
                )
            body = "FOR EACH ROW EXECUTE FUNCTION refuse_update()"
            drop = f"DROP TRIGGER refuse_update ON {TABLE}; DROP FUNCTION refuse_update()"
        else:
            body = "WHEN NEW.name = 'f9' BEGIN SELECT RAISE(ABORT, 'update refused'); END"
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE TRIGGER refuse_update BEFORE UPDATE ON {TABLE} {body}")
        try:
            with statements() as queries:
                for _ in range(2):
                    with self.assertRaisesMessage(LockError, "update refused"):
                        self.provider.lock(self.config(name="f9"))
        finally:
            with connection.cursor() as cursor:
                cursor.execute(drop)
        self.assertEqual(self.count(queries, "INSERT"), 2)
        self.take(name="f9").unlock()

    def test_deleted_row_does_not_block_a_known_name(self) -> None:
        self.take().unlock()
        TaskLock.objects.filter(name=self.name).delete()
        self.take().unlock()
        self.assertTrue(TaskLock.objects.filter(name=self.name).exists())

    # -- D: SQL providers -----------------------------------------------------------------------

    def test_stale_row_of_another_owner_is_taken_over(self) -> None:
        """D1."""
        TaskLock.objects.create(
            name=self.name,
            lock_until=now_plus(days=-1),
            locked_at=now_plus(days=-1),
            locked_by="me",
        )
        self.assertFalse(self.is_locked(self.name))
        lock = self.take()
        self.assertTrue(self.is_locked(self.name))
        self.assertEqual(TaskLock.objects.get(name=self.name).locked_by, self.provider.owner)
        lock.unlock()
        self.assertFalse(self.is_locked(self.name))

    def test_fuzz_inside_outer_transactions(self) -> None:
        """D2: each thread's loop runs in transaction.atomic(); on a server it has written."""
        if SERVER:
            outer = self.in_transaction("default", write=True)
            counters = fuzz(DatabaseLockProvider, iterations=self.fuzz_iterations, around=outer)
            self.assertEqual(counters, self.fuzz_expected())
            self.assertFalse(TaskRun.objects.exists())
            return
        # SQLite allows one writer; a DEFERRED transaction that has not written holds no lock.
        with extra_database(self, "deferred", OPTIONS={"transaction_mode": None}) as alias:
            outer = self.in_transaction(alias, write=False)
            counters = fuzz(
                lambda: DatabaseLockProvider(using=alias),
                iterations=self.fuzz_iterations,
                around=outer,
            )
        self.assertEqual(counters, self.fuzz_expected())

    def test_too_long_name_raises(self) -> None:
        """D3: not None, not truncated."""
        config = self.config()
        object.__setattr__(config, "name", "lock name that is too long " * 10)
        with self.assertRaises(LockError) as raised:
            self.provider.lock(config)
        if SERVER:  # a strict server refuses the value
            self.assertIsInstance(raised.exception.__cause__, DataError)
        if MYSQL:  # MySQL can be told to truncate instead
            with extra_database(
                self, "lax", OPTIONS={"init_command": "SET sql_mode = ''"}
            ) as alias:
                with self.assertRaisesMessage(LockError, "270 characters"):
                    DatabaseLockProvider(using=alias).lock(config)
        if not SERVER:
            self.assertIn("270 characters", str(raised.exception))
        self.assertFalse(TaskLock.objects.exists())

    # -- E: storage -----------------------------------------------------------------------------

    def test_stored_times_are_utc(self) -> None:
        """E4, E7: UTC whatever TIME_ZONE is, readable through the ORM (the admin)."""
        with override_settings(TIME_ZONE="America/Los_Angeles"):
            lock = self.take("60s")
            row = TaskLock.objects.get(name=self.name)
            self.assertEqual((row.locked_at, row.lock_until), (lock.locked_at, lock.lock_until))
            self.assertLess(abs(row.lock_until - now_plus(seconds=60)), timedelta(seconds=10))
            lock.unlock()
            row.refresh_from_db()
            self.assertLess(abs(row.lock_until - now_plus()), timedelta(seconds=10))

    def test_locked_at_comes_from_the_storage_clock(self) -> None:
        before = storage_now()
        lock = self.take("10s")
        self.assertLessEqual(before, lock.locked_at)
        self.assertLessEqual(lock.locked_at, storage_now())

    @pytest.mark.vendor("mysql")
    def test_mysql_uses_the_server_clock(self) -> None:
        frozen = datetime(2031, 1, 1, 0, 0, 0, 250000, tzinfo=UTC)  # 1924992000.25
        init = "SET @@session.timestamp = 1924992000.25"
        with extra_database(self, "skewed", OPTIONS={"init_command": init}) as alias:
            lock = DatabaseLockProvider(using=alias).lock(self.config("10s"))
            self.assertEqual(
                (lock.locked_at, lock.lock_until), (frozen, frozen + timedelta(seconds=10))
            )
            row = TaskLock.objects.get(name=self.name)
            self.assertEqual((row.locked_at, row.lock_until), (lock.locked_at, lock.lock_until))
            # By the real server clock the lock is held until 2031, whatever the client says.
            self.assertIsNone(self.provider.lock(self.config()))
            lock.unlock()
            self.assertEqual(self.stored_lock_until(self.name), frozen)

    @pytest.mark.vendor("mysql", "postgresql")
    def test_server_clock_decides_not_the_clock_of_the_client(self) -> None:
        """A client whose clock runs an hour fast (libfaketime) stores the server's time."""
        before = storage_now()
        output = run_helper(["locked_at", self.name], FAKETIME="+1h")
        client_now, locked_at = map(datetime.fromisoformat, output.split())
        self.assertGreater(client_now, before + timedelta(minutes=59))  # the skew took effect
        self.assertLessEqual(before, locked_at)
        self.assertLessEqual(locked_at, storage_now())
        self.assertEqual(TaskLock.objects.get(name=self.name).locked_at, locked_at)

    def test_lock_names_are_case_sensitive_except_on_mysql(self) -> None:
        """MySQL compares with the column's case-insensitive collation; the others do not."""
        self.take(name="Nightly-Report")
        other = self.provider.lock(self.config(name="nightly-report"))
        self.assertEqual(other is None, MYSQL)

    @pytest.mark.vendor("postgresql")
    def test_row_locked_by_another_transaction_does_not_hang_the_locker(self) -> None:
        """A statement waits lock_wait_timeout for a row another transaction holds, then gives
        up: taking counts as held elsewhere, unlocking and extending raise LockError."""
        held = self.take("1h")
        self.take(name="free").unlock()
        blocker = connections.create_connection("default")
        limit = DatabaseLockProvider.lock_wait_timeout.total_seconds() + 3
        try:
            with blocker.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute(
                    f"SELECT 1 FROM {TABLE} WHERE name IN (%s, 'free') FOR UPDATE", [self.name]
                )
                started = time.monotonic()
                with self.assertLogs("django_scheduling.locking.database", "WARNING") as logs:
                    self.assertIsNone(self.make_provider("another").lock(self.config(name="free")))
                self.assertLess(time.monotonic() - started, limit)
                self.assertIn("stayed locked by another transaction", logs.output[0])
                started = time.monotonic()
                with self.assertRaisesMessage(LockError, "lock timeout"):
                    held.extend("2h")
                with self.assertRaisesMessage(LockError, "Could not release"):
                    held.unlock()
                self.assertLess(time.monotonic() - started, 2 * limit)
                self.assertTrue(held.valid)  # a failed unlock leaves the handle usable
                cursor.execute("ROLLBACK")
        finally:
            blocker.close()
        self.assertIs(held.unlock(), True)
        self.assertFalse(self.is_locked(self.name))
        self.take(name="free").unlock()

    def test_lock_in_a_transaction_that_rolls_back_is_still_held(self) -> None:
        """E8-E10: the lock commits at once, on its own."""
        with extra_database(self, "deferred", OPTIONS={"transaction_mode": None}) as sqlite_alias:
            alias = "default" if SERVER else sqlite_alias
            provider = DatabaseLockProvider(using=alias)
            with self.in_transaction(alias, write=SERVER)():
                lock = provider.lock(self.config())
                self.assertIsNotNone(lock)
                other = connections.create_connection("default")
                try:
                    self.assertTrue(locked_on(other, self.name))  # seen before the outer ends
                finally:
                    other.close()
            self.assertFalse(TaskRun.objects.exists())  # the outer transaction did roll back
            self.assertTrue(self.is_locked(self.name))
            self.assertIsNone(self.make_provider("another-instance").lock(self.config()))
            lock.unlock()
            provider.close()
        self.assertFalse(self.is_locked(self.name))

    @pytest.mark.vendor("sqlite")
    def test_sqlite_lock_inside_an_immediate_transaction_fails_fast(self) -> None:
        self.assertEqual(connection.transaction_mode, "IMMEDIATE", "the test settings changed")
        started = time.monotonic()
        with transaction.atomic():
            with self.assertRaisesMessage(LockError, "holds the write lock the lock needs"):
                self.provider.lock(self.config())
        self.assertLess(time.monotonic() - started, 1)

    def test_construction_runs_no_query(self) -> None:
        """E13: the database and the owner are read at first use."""
        with self.assertNumQueries(0):
            provider = DatabaseLockProvider()
        with override_settings(SCHEDULING={"INSTANCE_NAME": "worker-7"}):
            provider.lock(self.config()).unlock()
        self.assertEqual(TaskLock.objects.get(name=self.name).locked_by, "worker-7")

    def test_unsupported_database_is_refused_at_first_use(self) -> None:
        with extra_database(self, "other", ENGINE="django.db.backends.dummy") as alias:
            provider = DatabaseLockProvider(using=alias)
            message = "supports mysql, postgresql, sqlite; the database 'other' is unknown"
            with self.assertRaisesMessage(ImproperlyConfigured, message):
                provider.lock(self.config())

    def test_owner_is_host_and_pid_and_follows_a_fork(self) -> None:
        import socket

        from django_scheduling.process import hostname, identity

        host = hostname()
        self.assertTrue(host.startswith(socket.gethostname()), host)
        me = identity()
        self.assertTrue(me.startswith(f"{host}:{os.getpid()}:"), me)
        self.assertEqual(self.provider.owner, me)
        self.take()
        self.assertEqual(TaskLock.objects.get(name=self.name).locked_by, me)
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            try:
                os.write(write, self.provider.owner.encode())
            finally:
                os._exit(0)
        os.close(write)
        owner_in_child = os.read(read, 1000).decode()
        os.close(read)
        os.waitpid(child, 0)
        self.assertTrue(owner_in_child.startswith(f"{host}:{child}:"), owner_in_child)

    # -- failures -------------------------------------------------------------------------------

    def test_lock_reconnects_once_after_the_connection_was_lost(self) -> None:
        with extra_database(self, "kept", CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=False) as alias:
            provider = DatabaseLockProvider(using=alias)
            provider.lock(self.config(name="warm-up")).unlock()
            lost = connections[alias]
            if MYSQL:  # what a server restart or wait_timeout does
                with connection.cursor() as cursor:
                    cursor.execute(f"KILL CONNECTION {lost.connection.thread_id()}")
            elif VENDOR == "postgresql":
                with connection.cursor() as cursor:
                    pid = lost.connection.info.backend_pid
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            else:
                lost.connection.close()
            with self.assertLogs("django_scheduling.locking.database", "WARNING") as logs:
                lock = provider.lock(self.config())
            self.assertIsNotNone(lock)
            self.assertIn("reconnecting", logs.output[0])
            lock.unlock()
        self.assertFalse(self.is_locked(self.name))

    def test_lock_works_after_the_threads_connection_was_closed_underneath(self) -> None:
        self.take().unlock()
        connection.connection.close()
        self.take().unlock()

    def test_unreachable_database_raises_lock_error(self) -> None:
        with extra_database(self, "broken", **BROKEN) as alias:
            with self.assertRaises(LockError) as raised:
                DatabaseLockProvider(using=alias).lock(self.config())
        self.assertIn("Could not take lock", str(raised.exception))
        self.assertIsNotNone(raised.exception.__cause__)

    def test_missing_table_raises_lock_error(self) -> None:
        if SERVER:
            empty = f"{connection.settings_dict['NAME']}_empty"
            with connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE {empty}")
        else:
            empty = os.path.join(os.path.dirname(connection.settings_dict["NAME"]), "empty.db")
        try:
            with extra_database(self, "empty", NAME=empty) as alias:
                with self.assertRaisesMessage(LockError, TABLE):
                    DatabaseLockProvider(using=alias).lock(self.config())
        finally:
            if SERVER:
                with connection.cursor() as cursor:
                    cursor.execute(f"DROP DATABASE {empty}")
            elif os.path.exists(empty):
                os.remove(empty)

    @pytest.mark.vendor("sqlite")
    def test_busy_sqlite_database_raises_lock_error(self) -> None:
        """Waiting out the busy timeout is a storage failure, not "held elsewhere"."""
        blocker = connections.create_connection("default")
        try:
            with blocker.cursor() as cursor:
                cursor.execute("BEGIN IMMEDIATE")
            with extra_database(self, "impatient", OPTIONS={"timeout": 0.05}) as alias:
                with self.assertRaisesMessage(LockError, "database is locked"):
                    DatabaseLockProvider(using=alias).lock(self.config())
        finally:
            blocker.close()

    def test_failed_unlock_raises_and_leaves_the_handle_usable(self) -> None:
        with extra_database(self, "flaky") as alias:
            lock = DatabaseLockProvider(using=alias).lock(self.config())
            settings_dict = connections[alias].settings_dict
            working = dict(settings_dict)
            connections[alias].close()
            settings_dict.update(BROKEN)
            with self.assertRaisesMessage(LockError, "Could not release lock"):
                lock.unlock()
            self.assertTrue(lock.valid)
            settings_dict.update(working)
            lock.unlock()
        self.assertFalse(self.is_locked(self.name))

    @pytest.mark.vendor("mysql", "postgresql")
    def test_lockers_waiting_on_an_uncommitted_insert_take_the_lock_once(self) -> None:
        """E14: two lockers wait on a row another transaction inserted; after its rollback one
        takes the lock and the other gets None. How the second learns it (on MySQL a deadlock,
        "a lost race", or the row the first committed) depends on timing: only the outcome is
        the contract."""
        import threading

        holder = connections.create_connection("default")
        outcomes: list[Any] = []

        def contend() -> None:
            try:
                outcomes.append(DatabaseLockProvider().lock(self.config()))
            finally:
                connections.close_all()

        def waiting() -> int:  # MariaDB refreshes innodb_trx once it is 0.1 s old
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT COUNT(*) FROM information_schema.innodb_trx "
                    "WHERE trx_state = 'LOCK WAIT'"
                    if MYSQL
                    else "SELECT COUNT(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                return cursor.fetchone()[0]

        now = "UTC_TIMESTAMP(6)" if MYSQL else "now()"
        try:
            with holder.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute(f"INSERT INTO {TABLE} VALUES (%s, {now}, {now}, 'x')", [self.name])
                threads = [threading.Thread(target=contend) for _ in range(2)]
                with self.assertLogs("django_scheduling.locking.database", "DEBUG") as logs:
                    for thread in threads:
                        thread.start()
                    wait_until(lambda: waiting() == 2, "both INSERTs wait", every=0.15)
                    cursor.execute("ROLLBACK")
                    for thread in threads:
                        thread.join()
        finally:
            holder.close()
        self.assertEqual(sorted(outcome is None for outcome in outcomes), [False, True])
        # The one that did not get it says why, whichever way it learnt it.
        said = "\n".join(logs.output)
        self.assertTrue("lost a race" in said or "is held elsewhere" in said, said)

    def test_processes_contending_lose_no_update(self) -> None:
        """Four processes count to 100 under one lock, in the database."""
        TaskLock.objects.create(
            name="counter", lock_until=now_plus(), locked_at=now_plus(), locked_by="0"
        )
        command = [sys.executable, "-m", "tests.locking_helpers", connection.settings_dict["NAME"]]
        workers = [
            subprocess.Popen(
                [*command, "25"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            for _ in range(4)
        ]
        try:
            for worker in workers:
                self.assertEqual(worker.stdout.readline().strip(), "ready")
            for worker in workers:
                worker.stdin.write("go\n")
                worker.stdin.flush()
            refused = [int(worker.communicate(timeout=60)[0]) for worker in workers]
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
        self.assertEqual([worker.returncode for worker in workers], [0] * 4)
        self.assertEqual(TaskLock.objects.get(name="counter").locked_by, "100")
        self.assertGreater(sum(refused), 0, "the processes never contended")
