"""The keep-alive of a running task's lock, with fake lock handles and the real keep-alive
thread."""

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.test import SimpleTestCase

from django_scheduling.locking import Lock, LockConfiguration
from django_scheduling.runtime.keepalive import BatchLocks, KeepAlive

DEADLINE = 10


class FakeLock:
    """A handle that records extend() and unlock() calls; each extend makes a new handle."""

    def __init__(self, config, calls, *, refuse_after=None):
        self.config = config
        self.locked_at = datetime.now(UTC)
        self.calls = calls
        self.refuse_after = refuse_after

    def extend(self, lock_at_most_for, lock_at_least_for=timedelta(0)):
        self.calls.append(("extend", self, lock_at_most_for, lock_at_least_for))
        self.calls.event.set()
        if self.refuse_after is not None and len(self.calls.extends()) > self.refuse_after:
            return None
        config = LockConfiguration(self.config.name, lock_at_most_for, lock_at_least_for)
        handle = FakeLock(config, self.calls, refuse_after=self.refuse_after)
        self.calls.returned.append(handle)
        return handle

    def unlock(self):
        self.calls.append(("unlock", self, None, None))
        return True


class SharedLock(Lock):
    """A handle that shares all but its name with the handles taken with it, as the database
    provider's do; unlock() is recorded."""

    __slots__ = ("calls",)

    def __init__(self, config, calls, at):
        super().__init__(config, locked_at=at, lock_until=at + timedelta(hours=1))
        self.calls = calls

    def _shared(self):
        return ("one acquisition", self.locked_at)

    def _named(self, name):
        return SharedLock(self.config._renamed(name), self.calls, self.locked_at)

    def _unlock(self):
        self.calls.append(("unlock", self, None, None))
        return True


class Calls(list):
    def __init__(self):
        super().__init__()
        self.event = threading.Event()
        self.returned = []  # the handles extend() returned, in order

    def extends(self):
        return [c for c in self if c[0] == "extend"]

    def wait_for_extends(self, count):
        while len(self.extends()) < count:
            self.event.clear()
            if len(self.extends()) >= count:
                break
            if not self.event.wait(DEADLINE):
                raise AssertionError(f"fewer than {count} extensions before the deadline")


class KeeperTestCase(SimpleTestCase):
    """A running keep-alive thread, and the calls the fake locks record."""

    def setUp(self):
        self.keeper = KeepAlive()
        self.keeper.start()
        self.addCleanup(self.keeper.stop)
        self.calls = Calls()


class KeepAliveTests(KeeperTestCase):
    def keep(self, most="400ms", least=0, **options):
        config = LockConfiguration("job", most, least)
        return self.keeper.hold(FakeLock(config, self.calls, **options), "job")

    def test_extends_each_time_on_the_newest_handle_and_unlocks_the_newest(self):
        kept = self.keep()
        self.calls.wait_for_extends(3)
        kept.release()
        extends = self.calls.extends()
        # Each extension is made on the handle the previous one returned.
        self.assertEqual([c[1] for c in extends[1:]], self.calls.returned[: len(extends) - 1])
        self.assertTrue(all(c[2] == timedelta(milliseconds=400) for c in extends))
        unlocks = [c for c in self.calls if c[0] == "unlock"]
        self.assertEqual(len(unlocks), 1)
        self.assertIs(unlocks[0][1], self.calls.returned[-1])

    def test_no_extension_after_release(self):
        kept = self.keep()
        self.calls.wait_for_extends(1)
        self.assertTrue(kept.release())
        self.assertEqual(len(self.keeper), 0)  # the keep-alive thread no longer holds it
        count = len(self.calls.extends())
        kept.extend()  # as the thread would if it still held it: nothing to extend
        self.assertEqual(len(self.calls.extends()), count)

    def test_stops_when_the_lock_was_lost(self):
        kept = self.keep(refuse_after=1)
        self.calls.wait_for_extends(2)  # the second extension is refused
        deadline = time.monotonic() + DEADLINE
        while not kept.lost and time.monotonic() < deadline:
            self.calls.event.wait(0.01)
        self.assertTrue(kept.lost)
        kept.extend()  # a later turn of the thread extends nothing
        self.assertEqual(len(self.calls.extends()), 2)
        self.assertFalse(kept.release())  # the run is told that its lock was lost
        self.assertEqual([c for c in self.calls if c[0] == "unlock"], [])  # nothing left to free

    def test_an_unlock_that_matches_no_row_reports_the_lock_lost(self):
        class TakenOver(FakeLock):
            def unlock(self):
                super().unlock()
                return False  # the row had been taken over by another instance

        kept = self.keeper.hold(TakenOver(LockConfiguration("job", "1h"), self.calls), "job")
        self.assertFalse(kept.release())
        self.assertTrue(kept.lost)

    def test_released_handles_leave_nothing_behind(self):
        for _ in range(100):
            self.keep(most="1h").release()
        self.assertEqual(len(self.keeper), 0)

    def test_carries_the_rest_of_lock_at_least_for(self):
        kept = self.keep(most="400ms", least="400ms")
        self.calls.wait_for_extends(1)
        kept.release()
        _, _, most, least = self.calls.extends()[0]
        # About 200 ms of the 400 ms remained at the first extension.
        self.assertLess(least, timedelta(milliseconds=400))
        self.assertGreater(least, timedelta(0))
        self.assertEqual(most, timedelta(milliseconds=400))


class BatchLocksTests(KeeperTestCase):
    """The locks of firings claimed together, while their runs wait and run: one keep-alive
    record."""

    def locks(self, count, most="1h", least=0, **options):
        return [
            FakeLock(LockConfiguration(f"job{i}", most, least), self.calls, **options)
            for i in range(count)
        ]

    def test_a_batch_is_one_record_until_each_run_ends(self):
        locks = self.locks(3)
        batch = BatchLocks(locks, self.keeper)
        self.assertEqual(len(self.keeper), 1)
        self.assertEqual(batch.detach(1), (locks[1], None, False))
        self.assertEqual(len(self.keeper), 1)  # the others still run
        self.assertEqual(batch.detach(1), (None, None, False))  # detached once only
        self.assertEqual(batch.detach(0), (locks[0], None, False))
        self.assertEqual(batch.detach(2), (locks[2], None, False))
        self.assertEqual(len(self.keeper), 0)  # gone with the last lock
        self.assertEqual(self.calls, [])  # nothing extended, nothing unlocked here

    def test_locks_held_longer_than_half_their_time_are_each_extended(self):
        locks = self.locks(3, most="400ms")
        batch = BatchLocks(locks, self.keeper)
        first = batch.detach(1)[0]  # one run ended at once
        self.calls.wait_for_extends(2)
        extended = {c[1] for c in self.calls.extends()}
        self.assertEqual(extended & set(locks), {locks[0], locks[2]})
        self.assertNotIn(first, extended)  # detached before: its caller releases it
        later = [batch.detach(0), batch.detach(2)]
        for handle, shared, lost in later:
            # The run that ends afterwards holds the newest handle.
            self.assertIn(handle, self.calls.returned)
            self.assertEqual((shared, lost), (None, False))
        self.assertEqual(len(self.keeper), 0)

    def test_a_lock_an_extension_finds_lost_is_not_released(self):
        locks = self.locks(2, most="400ms", refuse_after=0)
        batch = BatchLocks(locks, self.keeper)
        self.calls.wait_for_extends(2)
        deadline = time.monotonic() + DEADLINE
        while not (batch.lost(0) and batch.lost(1)) and time.monotonic() < deadline:
            self.calls.event.wait(0.01)
        self.assertTrue(batch.lost(0))
        self.assertEqual(batch.detach(0), (None, None, True))
        self.assertFalse(batch.release(1))  # told that its lock was lost
        self.assertEqual([c for c in self.calls if c[0] == "unlock"], [])

    def test_release_unlocks_at_once(self):
        locks = self.locks(2)
        batch = BatchLocks(locks, self.keeper)
        self.assertTrue(batch.release(0))
        self.assertEqual([c[1] for c in self.calls if c[0] == "unlock"], [locks[0]])
        self.assertEqual(batch.detach(0), (None, None, False))  # released already
        self.assertEqual(len(self.keeper), 1)  # the batch's record, for the other lock

    def test_lock_at_least_for_counts_from_the_claim_not_the_start(self):
        # Taken 200 ms ago with lock_at_least_for 300 ms: when the extension comes (due after
        # 200 ms, half of lock_at_most_for), nothing of it remains.
        locks = self.locks(1, most="400ms", least="300ms")
        since = datetime.now(UTC) - timedelta(milliseconds=200)
        batch = BatchLocks(locks, self.keeper, since=since)
        self.calls.wait_for_extends(1)
        batch.release(0)
        _, _, most, least = self.calls.extends()[0]
        self.assertEqual(least, timedelta(0))
        self.assertEqual(most, timedelta(milliseconds=400))

    def test_locks_taken_together_are_kept_as_one_handle_and_their_names(self):
        at = datetime.now(UTC)
        locks = [SharedLock(LockConfiguration(f"job{i}", "1h"), self.calls, at) for i in range(3)]
        batch = BatchLocks(locks, self.keeper)
        self.assertEqual(batch.locked_at(2), at)
        # Released by its name through the batch's one handle (the first lock's).
        self.assertEqual(batch.detach(1), (None, locks[0], False))
        # Released at once (a shutdown): a handle made from the batch's for that name.
        self.assertTrue(batch.release(2))
        ((_, handle, _, _),) = self.calls
        self.assertEqual((handle.config.name, handle.locked_at), ("job2", at))
        self.assertIsNot(handle, locks[2])
        self.assertEqual(batch.detach(0), (None, locks[0], False))
        self.assertEqual(len(self.keeper), 0)

    def test_without_a_keep_alive_thread_each_run_still_gets_its_lock(self):
        locks = self.locks(2)
        batch = BatchLocks(locks, None)
        self.assertEqual([batch.detach(0)[0], batch.detach(1)[0]], locks)


class QueryingLock(FakeLock):
    """A handle whose extension queries the database, as the database provider's does, and
    notes the connection it used (the keep-alive thread's own)."""

    def __init__(self, config, calls, used):
        super().__init__(config, calls)
        self.used = used

    def extend(self, lock_at_most_for, lock_at_least_for=timedelta(0)):
        from django.db import connections

        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
        self.used.append(connections["default"])
        return super().extend(lock_at_most_for, lock_at_least_for)


@pytest.mark.vendor("postgresql", "mysql")  # Django never closes an in-memory SQLite one
class KeepAliveConnectionTests(SimpleTestCase):
    databases = {"default"}

    def test_the_thread_closes_its_database_connection_when_it_stops(self):
        # A stopped scheduler in a process that goes on (autostart in a test runner, a
        # service stopped and started again) must not leave the thread's session open.
        keeper = KeepAlive()
        keeper.start()
        self.addCleanup(keeper.stop)
        calls, used = Calls(), []
        held = keeper.hold(QueryingLock(LockConfiguration("job", "400ms"), calls, used), "job")
        calls.wait_for_extends(1)
        held.release()
        keeper.stop()
        self.assertFalse(keeper.alive)
        self.assertTrue(used)
        self.assertTrue(all(wrapper.connection is None for wrapper in used))
