"""The keep-alive of a running task's lock, with fake lock handles and the real timer thread."""

import threading
from datetime import UTC, datetime, timedelta

from django.test import SimpleTestCase

from django_scheduling.keepalive import KEEP_ALIVE_MINIMUM, KeptAliveLock
from django_scheduling.locking import LockConfiguration
from django_scheduling.scheduler import Timer

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


class KeepAliveTests(SimpleTestCase):
    def setUp(self):
        self.timer = Timer()
        self.timer.start()
        self.addCleanup(self.timer.stop)
        self.calls = Calls()

    def keep(self, most="400ms", least=0, **options):
        config = LockConfiguration("job", most, least)
        return KeptAliveLock(FakeLock(config, self.calls, **options), self.timer, "job")

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
        kept.release()
        count = len(self.calls.extends())
        # Wait out two more intervals: a cancelled keep-alive stays silent.
        threading.Event().wait(2 * KEEP_ALIVE_MINIMUM.total_seconds() + 0.1)
        self.assertEqual(len(self.calls.extends()), count)

    def test_stops_when_the_lock_was_lost(self):
        kept = self.keep(refuse_after=1)
        self.calls.wait_for_extends(2)  # the second extension is refused
        threading.Event().wait(2 * KEEP_ALIVE_MINIMUM.total_seconds() + 0.1)
        self.assertEqual(len(self.calls.extends()), 2)
        kept.release()
        self.assertEqual([c for c in self.calls if c[0] == "unlock"], [])  # nothing left to free

    def test_carries_the_rest_of_lock_at_least_for(self):
        kept = self.keep(most="400ms", least="400ms")
        self.calls.wait_for_extends(1)
        kept.release()
        _, _, most, least = self.calls.extends()[0]
        # About 200 ms of the 400 ms remained at the first extension.
        self.assertLess(least, timedelta(milliseconds=400))
        self.assertGreater(least, timedelta(0))
        self.assertEqual(most, timedelta(milliseconds=400))
