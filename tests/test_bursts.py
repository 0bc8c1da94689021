"""While the scheduler starts a burst of firings, the writer and the run events wait for it:
at most ``wait_at_most`` after the burst began, and the writer not at a stop. And the table of
the runs under way, which the workers of a burst change without a lock.

The waits are watched through a frozen clock: with it, a waiter can only return once the burst
is started, so a test knows it is waiting once it has read the clock, without a sleep.
"""

from __future__ import annotations

import threading
import time
from unittest import mock

from django.dispatch import Signal
from django.test import SimpleTestCase, TransactionTestCase

from django_scheduling.bursts import Bursts
from django_scheduling.conf import get_settings
from django_scheduling.locking import DatabaseLockProvider
from django_scheduling.observability.events import RunEvents
from django_scheduling.runtime.calls import Entry, FunctionCall
from django_scheduling.runtime.firing.invoke import Underway, _Running
from django_scheduling.runtime.maintenance import Maintenance
from django_scheduling.runtime.outbox import Outbox
from django_scheduling.runtime.scheduler import Scheduler
from django_scheduling.runtime.writer import EndWriter, Finished

from .test_reliability import NoScheduler

DEADLINE = 10.0


def poll_until(predicate, timeout=DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.001)


class FrozenClock:
    """A clock that stands still until moved, and tells which threads have read it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.readers: set[str] = set()

    def __call__(self) -> float:
        self.readers.add(threading.current_thread().name)
        return self.now


class BurstsTests(SimpleTestCase):
    def setUp(self):
        self.clock = FrozenClock()
        self.bursts = Bursts(wait_at_most=0.05, clock=self.clock)

    def waiter(self) -> threading.Thread:
        thread = threading.Thread(target=self.bursts.wait, name="waiter", daemon=True)
        thread.start()
        self.addCleanup(thread.join, DEADLINE)
        return thread

    def test_no_burst_no_wait(self):
        self.bursts.wait()  # returns at once: a frozen clock would hold it for ever
        self.assertEqual(self.bursts.starting, 0)

    def test_a_waiter_goes_on_once_the_burst_is_started(self):
        burst = self.bursts.begin()
        waiter = self.waiter()
        poll_until(lambda: "waiter" in self.clock.readers)
        self.assertTrue(waiter.is_alive())  # the clock stands still: only started() frees it
        burst.started()
        waiter.join(DEADLINE)
        self.assertFalse(waiter.is_alive())
        self.assertEqual(self.bursts.starting, 0)

    def test_a_waiter_waits_for_every_burst_being_started(self):
        first, second = self.bursts.begin(), self.bursts.begin()
        waiter = self.waiter()
        poll_until(lambda: "waiter" in self.clock.readers)
        first.started()
        first.started()  # said twice (two workers took the last calls): counts once
        self.assertEqual(self.bursts.starting, 1)
        self.assertTrue(waiter.is_alive())
        second.started()
        waiter.join(DEADLINE)
        self.assertFalse(waiter.is_alive())

    def test_a_burst_never_started_holds_waiters_up_no_longer_than_wait_at_most(self):
        self.bursts.begin()  # its workers never say it started
        self.clock.now += 0.05
        self.bursts.wait()  # returns at once
        self.assertEqual(self.bursts.starting, 1)
        waiter = self.waiter()  # and so does every wait after it, until the next burst
        waiter.join(DEADLINE)
        self.assertFalse(waiter.is_alive())

    def test_bursts_that_follow_each_other_hold_a_waiter_no_longer_than_wait_at_most(self):
        self.bursts.begin()
        waiter = self.waiter()
        poll_until(lambda: "waiter" in self.clock.readers)
        for _ in range(3):  # a new burst every 30 ms, none started yet
            self.clock.now += 0.03
            self.bursts.begin()
        waiter.join(DEADLINE)  # woken by its wait of 0.05 s (real time), past its deadline
        self.assertFalse(waiter.is_alive())
        self.assertEqual(self.bursts.starting, 4)

    def test_a_waiter_held_by_a_burst_goes_on_when_its_time_is_up(self):
        self.bursts.begin()
        waiter = self.waiter()
        poll_until(lambda: "waiter" in self.clock.readers)
        self.clock.now += 0.05  # read again when its wait of 0.05 s (real time) ends
        waiter.join(DEADLINE)
        self.assertFalse(waiter.is_alive())
        self.assertEqual(self.bursts.starting, 1)


class RecordingBursts(Bursts):
    def __init__(self) -> None:
        super().__init__(clock=FrozenClock())
        self.begun = 0

    def begin(self):
        self.begun += 1
        return super().begin()


class SchedulerBurstTests(SimpleTestCase):
    """The scheduler begins a burst when it hands two or more calls to the pool at once, and
    it is started once the last of them is taken up, before that one runs."""

    def setUp(self):
        self.bursts = RecordingBursts()
        patcher = mock.patch("django_scheduling.runtime.scheduler.bursts", self.bursts)
        patcher.start()
        self.addCleanup(patcher.stop)
        self.scheduler = Scheduler(mock.Mock(), core_pool_size=2, max_pool_size=4)
        self.addCleanup(self.scheduler.shutdown, DEADLINE)

    def run_calls(self, count: int) -> list[tuple[int, int]]:
        """Run *count* calls; return (index, bursts being started) as each one ran."""
        ran: list[tuple[int, int]] = []
        finished = threading.Semaphore(0)

        def call(index: int) -> FunctionCall:
            def run(done) -> None:
                ran.append((index, self.bursts.starting))
                finished.release()

            made = FunctionCall(run)
            made.entry = Entry(f"t{index}")
            return made

        self.scheduler._run_calls([call(index) for index in range(count)])
        for _ in range(count):
            self.assertTrue(finished.acquire(timeout=DEADLINE))
        return ran

    def test_a_burst_is_started_before_its_last_call_runs(self):
        ran = self.run_calls(50)
        self.assertEqual(self.bursts.begun, 1)
        self.assertEqual(sorted(index for index, _ in ran), list(range(50)))
        last = dict(ran)[49]  # taken last: the calls are taken in order
        self.assertEqual(last, 0)
        self.assertEqual(self.bursts.starting, 0)

    def test_a_single_call_is_no_burst(self):
        self.assertEqual(self.run_calls(1), [(0, 0)])
        self.assertEqual(self.bursts.begun, 0)


class WaitersTests(TransactionTestCase):
    """The writer, the run events' thread and the maintenance thread wait while a burst is
    being started."""

    def setUp(self):
        self.clock = FrozenClock()
        self.bursts = Bursts(clock=self.clock)
        for module in ("runtime.writer", "observability.events", "runtime.maintenance"):
            patcher = mock.patch(f"django_scheduling.{module}.bursts", self.bursts)
            patcher.start()
            self.addCleanup(patcher.stop)

    def writer(self) -> EndWriter:
        return EndWriter(
            using="default",
            provider=DatabaseLockProvider(owner="a"),
            outbox=Outbox(),
            name="test-writer",
        )

    def test_the_writer_records_the_ends_once_the_burst_is_started(self):
        writer = self.writer()
        writer.start()
        self.addCleanup(writer.stop, DEADLINE)
        burst = self.bursts.begin()
        told = []
        writer.add(Finished("job", None, None, None, told.append))
        poll_until(lambda: "test-writer" in self.clock.readers)
        self.assertEqual(told, [])
        burst.started()
        self.assertTrue(writer.drain(DEADLINE))
        self.assertEqual(told, [False])

    def test_a_stopping_writer_does_not_wait(self):
        writer = self.writer()
        self.bursts.begin()  # never started, and the clock stands still
        told = []
        # Ends waiting when the writer is asked to stop: it writes them and exits.
        writer._items.append(Finished("job", None, None, None, told.append))
        writer._stopped = True
        writer.start()
        writer.stop(DEADLINE)
        self.assertFalse(writer.alive)
        self.assertEqual(told, [False])

    def test_the_run_events_are_delivered_once_the_burst_is_started(self):
        events = RunEvents(name="test-events")
        signal = Signal()
        heard = []
        signal.connect(lambda sender, **kwargs: heard.append(sender), weak=False)
        burst = self.bursts.begin()
        events.publish(signal, "job")
        poll_until(lambda: "test-events" in self.clock.readers)
        self.assertEqual(heard, [])
        burst.started()
        self.assertTrue(events.drain(DEADLINE))
        self.assertEqual(heard, ["job"])

    def test_the_maintenance_pass_comes_once_the_burst_is_started(self):
        maintenance = Maintenance(
            conf=get_settings(), scheduler=NoScheduler(), pipeline=None, outbox=Outbox(), tasks={}
        )
        before = maintenance.last_pass
        burst = self.bursts.begin()
        maintenance.start()
        self.addCleanup(maintenance.stop, DEADLINE)
        poll_until(lambda: "scheduling-maintenance" in self.clock.readers)
        self.assertEqual(maintenance.last_pass, before)
        burst.started()
        poll_until(lambda: maintenance.last_pass != before)


class UnderwayTests(SimpleTestCase):
    """The runs of a process, changed by the workers without a lock: what each step leaves."""

    def setUp(self):
        self.underway = Underway()
        self.runs = {name: mock.Mock(name=name) for name in ("a", "b", "c")}
        for name, run in self.runs.items():
            run.spec.name = name
        self.underway.add_claimed(list(self.runs.values()))

    def test_a_started_run_is_no_longer_claimed(self):
        self.underway.started("a")
        running, claimed = self.underway.take(["a", "b"])
        self.assertEqual((running, claimed), ([], [self.runs["b"]]))
        # Taken once: a second shutdown pass finds nothing more.
        self.assertEqual(self.underway.take(["a", "b"]), ([], []))

    def test_the_runs_being_called_are_read_as_a_copy(self):
        first = _Running(run_id=1, run=None)
        self.underway.begin("a", first)
        seen = self.underway.running()
        self.underway.begin("b", _Running(run_id=2, run=None))
        self.underway.end("a")
        self.assertEqual(seen, {"a": first})  # what was running when it was read
        self.assertEqual(list(self.underway.running()), ["b"])
        self.assertEqual(list(self.underway.durations()), ["b"])
        running, _ = self.underway.take(["a", "b"])
        self.assertEqual([item.run_id for item in running], [2])

    def test_claims_added_after_the_table_emptied_are_kept(self):
        for name in self.runs:
            self.underway.started(name)
        later = mock.Mock()
        later.spec.name = "d"
        self.underway.add_claimed([later])
        self.assertEqual(self.underway.take(["d"]), ([], [later]))
