"""The delay queue and dispatcher, with an in-memory runner: no database involved.

Synchronisation is by events and polls with deadlines; assertions about timing look at the fire
times the scheduler asked for, which are exact, not at measured durations.
"""

import functools
import itertools
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from django.test import SimpleTestCase

from django_scheduling import shutdown_requested
from django_scheduling.runtime.calls import Entry, FunctionCall, RunRequest
from django_scheduling.runtime.claim_queue import CLAIM_THREADS, ClaimQueue, _earliest
from django_scheduling.runtime.delay_queue import DelayQueue, Due
from django_scheduling.runtime.scheduler import (
    BATCH_SIZE,
    CLAIM_AHEAD_MAX,
    Scheduler,
    claim_ahead,
)
from django_scheduling.schedules.triggers import FixedDelayTrigger, FixedRateTrigger, TriggerState

DEADLINE = 10.0


def now() -> datetime:
    return datetime.now(UTC)


def wait_for(predicate, timeout=DEADLINE):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.005)


@dataclass
class Task:
    trigger: object
    action: object = None
    state: TriggerState = field(default_factory=TriggerState)
    runs: list = field(default_factory=list)  # (fire_time, started, finished)


class MemoryRunner:
    """Run tasks in memory with real triggers, recording what happened: each claim notes when
    it was made, and each claimed firing runs as a ``Call`` that starts at its time."""

    def __init__(self):
        self.rejections = []
        self.claims: list[tuple[datetime, datetime]] = []  # (claimed at, scheduled firing)
        self.lock = threading.Lock()

    def dispatch(self, items):
        claimed_at = now()
        with self.lock:
            self.claims.extend(
                (claimed_at, firing) for _, firing in items if isinstance(firing, datetime)
            )
        return [
            FunctionCall(
                functools.partial(self._run_call, entry, firing),
                firing if isinstance(firing, datetime) else None,
            )
            for entry, firing in items
        ]

    def _run_call(self, entry, firing, done):
        done(self.run(entry, firing))

    def drain(self, timeout):
        return True

    def first_fire_time(self, entry, *, now):
        task = entry.payload
        if task.state.anchor is None:
            task.state = replace(task.state, anchor=task.trigger.initial_anchor(now=now))
        return task.trigger.next_fire_time(now=now, state=task.state)

    def run(self, entry, firing):
        task = entry.payload
        fire_time = None if isinstance(firing, RunRequest) else firing
        started = now()
        if task.action is not None:
            task.action()
        finished = now()
        with self.lock:
            task.runs.append((fire_time, started, finished))
        if fire_time is not None:
            task.state = replace(task.state, last_fire_time=fire_time)
        task.state = replace(task.state, last_finished=finished)
        return task.trigger.next_fire_time(now=finished, state=task.state)

    def rejected(self, entry, fire_time, stats):
        self.rejections.append((entry.name, fire_time, stats))
        return None


class SchedulerTests(SimpleTestCase):
    def make(self, **options):
        runner = MemoryRunner()
        scheduler = Scheduler(runner, **options)
        self.addCleanup(scheduler.shutdown, 5)
        return runner, scheduler

    def test_an_entry_moved_to_another_time_is_taken_there_only_and_once(self):
        # Not started: the delay queue is driven with explicit times.
        _runner, scheduler = self.make()
        first = now() + timedelta(hours=1)
        moved, twice = first + timedelta(minutes=10), first + timedelta(minutes=20)
        task = Task(FixedRateTrigger(timedelta(hours=1)), state=TriggerState(anchor=first))
        entry = Entry("moved", task)
        scheduler.add(entry)
        with scheduler._cond:
            scheduler.queue.push(entry, moved)

        def taken(at):
            with scheduler._cond:
                due, _ = scheduler.queue.pop(at.timestamp(), at.timestamp())
            return [(work.entry.name, work.firing) for work in due]

        self.assertEqual(taken(first), [])  # its old time: no longer its schedule
        self.assertEqual(taken(moved), [("moved", moved)])
        with scheduler._cond:
            scheduler._finish(entry, twice, reschedule=True)
            scheduler.queue.push(entry, twice)  # listed twice at the same time...
        self.assertEqual(taken(twice), [("moved", twice)])  # ...taken once

    def test_a_past_fire_time_runs_at_once(self):
        _runner, scheduler = self.make()
        ran = threading.Event()
        task = Task(FixedRateTrigger(timedelta(hours=1)), ran.set)
        task.state = TriggerState(anchor=now() - timedelta(minutes=5))
        scheduler.add(Entry("late", task))
        scheduler.start()
        self.assertTrue(ran.wait(DEADLINE))
        self.assertEqual(task.runs[0][0], task.state.anchor)

    def test_an_earlier_task_wakes_the_sleeping_dispatcher(self):
        _runner, scheduler = self.make()
        far = Task(FixedRateTrigger(timedelta(hours=1), initial_delay=timedelta(hours=1)))
        scheduler.add(Entry("far", far))
        scheduler.start()
        # The dispatcher now sleeps toward "far" (or MAX_SLEEP, 30 s). A new task due in 50 ms
        # must run long before that.
        ran = threading.Event()
        soon = Task(
            FixedRateTrigger(timedelta(hours=1), initial_delay=timedelta(milliseconds=50)), ran.set
        )
        added = time.monotonic()
        scheduler.add(Entry("soon", soon))
        self.assertTrue(ran.wait(DEADLINE))
        self.assertLess(time.monotonic() - added, DelayQueue.MAX_SLEEP / 2)
        self.assertEqual(far.runs, [])

    def test_one_task_never_runs_twice_at_once(self):
        _runner, scheduler = self.make(core_pool_size=4, max_pool_size=4)
        release = threading.Event()
        active, most = [0], [0]
        lock = threading.Lock()

        def slow():
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            release.wait(DEADLINE)
            with lock:
                active[0] -= 1

        task = Task(FixedRateTrigger(timedelta(milliseconds=10)), slow)
        probe = Task(FixedRateTrigger(timedelta(milliseconds=10)))
        scheduler.add(Entry("slow", task))
        scheduler.start()
        wait_for(lambda: active[0] == 1)
        scheduler.add(Entry("probe", probe))
        # The probe, on the same 10 ms grid, runs ten times while the first run blocks: that
        # many slots of "slow" came due, and none may start alongside its running run.
        wait_for(lambda: len(probe.runs) >= 10)
        self.assertEqual(most[0], 1)
        release.set()
        wait_for(lambda: len(task.runs) >= 3)
        self.assertEqual(most[0], 1)

    def test_fixed_rate_stays_on_its_grid(self):
        _runner, scheduler = self.make()
        task = Task(FixedRateTrigger(timedelta(milliseconds=40)))
        scheduler.add(Entry("rate", task))
        scheduler.start()
        wait_for(lambda: len(task.runs) >= 5)
        anchor = task.state.anchor
        fire_times = [run[0] for run in task.runs[:5]]
        self.assertEqual(fire_times, [anchor + k * timedelta(milliseconds=40) for k in range(5)])

    def test_fixed_delay_counts_from_each_finish(self):
        _runner, scheduler = self.make()
        task = Task(FixedDelayTrigger(timedelta(milliseconds=40)), lambda: time.sleep(0.01))
        scheduler.add(Entry("delay", task))
        scheduler.start()
        wait_for(lambda: len(task.runs) >= 4)
        runs = task.runs[:4]
        for previous, following in itertools.pairwise(runs):
            self.assertEqual(following[0], previous[2] + timedelta(milliseconds=40))
            self.assertGreaterEqual(following[1], following[0])

    def test_run_now_runs_at_once_and_after_a_running_run(self):
        _runner, scheduler = self.make()
        started, release = threading.Event(), threading.Event()
        self.addCleanup(release.set)

        def body():
            started.set()
            release.wait(DEADLINE)

        task = Task(FixedRateTrigger(timedelta(hours=1), initial_delay=timedelta(hours=1)), body)
        scheduler.add(Entry("manual", task))
        scheduler.start()
        self.assertTrue(scheduler.run_now("manual"))
        self.assertTrue(started.wait(DEADLINE))
        # Asked twice while it runs: one run follows the running one, not two, not alongside.
        self.assertTrue(scheduler.run_now("manual"))
        self.assertTrue(scheduler.run_now("manual"))
        self.assertEqual(len(task.runs), 0)
        release.set()
        wait_for(lambda: len(task.runs) == 2)
        self.assertEqual([run[0] for run in task.runs], [None, None])
        self.assertLessEqual(task.runs[0][2], task.runs[1][1])  # one after the other
        self.assertFalse(scheduler.run_now("unknown"))

    def test_a_runner_error_backs_off_instead_of_retrying_at_once(self):
        calls = []

        class Failing(MemoryRunner):
            def run(self, entry, firing):
                calls.append(time.monotonic())
                raise RuntimeError("the database is down")

        scheduler = Scheduler(Failing())
        self.addCleanup(scheduler.shutdown, 5)
        entry = Entry("broken", Task(FixedRateTrigger(timedelta(seconds=1))))
        scheduler.add(entry)
        scheduler.start()
        wait_for(lambda: len(calls) >= 2, timeout=5)
        # The second attempt waited for the back-off (1 s), and the next one doubles it.
        self.assertGreaterEqual(calls[1] - calls[0], 0.9)

        def second_failure_rescheduled():
            # The failure count goes up before the entry is put back with its retry time: look
            # under the scheduler's lock, which the reschedule holds throughout.
            with scheduler._cond:
                return entry.failures >= 2 and not entry.running

        wait_for(second_failure_rescheduled)
        self.assertGreaterEqual(
            entry.next_fire_time - now(), timedelta(seconds=1) - timedelta(milliseconds=100)
        )

    def test_rejection_is_reported_with_the_numbers(self):
        runner, scheduler = self.make(
            core_pool_size=1, max_pool_size=1, queue_capacity=0, rejection_policy="abort"
        )
        release = threading.Event()
        started = threading.Event()

        def block():
            started.set()
            release.wait(DEADLINE)

        self.addCleanup(release.set)
        scheduler.add(Entry("blocker", Task(FixedRateTrigger(timedelta(hours=1)), block)))
        scheduler.start()
        self.assertTrue(started.wait(DEADLINE))
        scheduler.add(Entry("victim", Task(FixedRateTrigger(timedelta(hours=1)))))
        wait_for(lambda: runner.rejections)
        name, _fire_time, stats = runner.rejections[0]
        self.assertEqual(name, "victim")
        self.assertEqual((stats.threads, stats.max_size, stats.queue_capacity), (1, 1, 0))

    def test_shutdown_waits_for_running_tasks(self):
        _runner, scheduler = self.make()
        started, release = threading.Event(), threading.Event()
        seen_shutdown = []

        def task_body():
            started.set()
            release.wait(DEADLINE)
            seen_shutdown.append(shutdown_requested())

        task = Task(FixedRateTrigger(timedelta(hours=1)), task_body)
        scheduler.add(Entry("busy", task))
        scheduler.start()
        self.assertTrue(started.wait(DEADLINE))
        result = []
        stopper = threading.Thread(target=lambda: result.append(scheduler.shutdown(DEADLINE)))
        stopper.start()
        wait_for(lambda: scheduler.stopping)
        self.assertTrue(stopper.is_alive())  # waiting for the running task
        release.set()
        stopper.join(DEADLINE)
        self.assertEqual(result, [[]])
        self.assertEqual(seen_shutdown, [True])
        self.assertEqual(len(task.runs), 1)

    def test_shutdown_timeout_reports_tasks_still_running(self):
        _runner, scheduler = self.make()
        started, release = threading.Event(), threading.Event()
        self.addCleanup(release.set)

        def stuck():
            started.set()
            release.wait(DEADLINE)

        scheduler.add(Entry("stuck", Task(FixedRateTrigger(timedelta(hours=1)), stuck)))
        scheduler.start()
        self.assertTrue(started.wait(DEADLINE))
        begun = time.monotonic()
        self.assertEqual(scheduler.shutdown(timeout=0.1), ["stuck"])
        self.assertLess(time.monotonic() - begun, DEADLINE)

    def test_shutdown_timeout_holds_under_caller_runs(self):
        # The dispatcher itself runs the task the full pool rejects: shutdown must not wait
        # for it past its timeout.
        _runner, scheduler = self.make(
            core_pool_size=1, max_pool_size=1, queue_capacity=0, rejection_policy="caller_runs"
        )
        started = threading.Event()
        release = threading.Event()
        self.addCleanup(release.set)
        in_dispatcher = threading.Event()

        def stuck():
            if "dispatcher" in threading.current_thread().name:
                in_dispatcher.set()
            started.set()
            release.wait(DEADLINE)

        scheduler.add(Entry("first", Task(FixedRateTrigger(timedelta(hours=1)), stuck)))
        scheduler.add(Entry("second", Task(FixedRateTrigger(timedelta(hours=1)), stuck)))
        scheduler.start()
        self.assertTrue(in_dispatcher.wait(DEADLINE))
        begun = time.monotonic()
        self.assertEqual(scheduler.shutdown(timeout=0.2), ["first", "second"])
        self.assertLess(time.monotonic() - begun, DEADLINE / 2)

    def test_shutdown_requested_follows_the_task_into_async_code(self):
        import asyncio

        from asgiref.sync import sync_to_async

        from django_scheduling.context import stopping_context

        def sync_part():
            return shutdown_requested()

        async def task():
            return await sync_to_async(sync_part)()

        with stopping_context(lambda: True):
            self.assertTrue(asyncio.run(task()))

    def test_a_claimed_firing_that_no_worker_could_take_runs_on_the_claiming_thread(self):
        # Claimed, it is this instance's to run: never dropped for want of a thread.
        _runner, scheduler = self.make()
        failures = []
        threads = []

        def submit(work, **options):
            failures.append(options.get("label"))
            raise RuntimeError("can't start new thread")

        scheduler.pool.submit = submit
        task = Task(
            FixedRateTrigger(timedelta(hours=1)),
            lambda: threads.append(threading.current_thread().name),
        )
        scheduler.add(Entry("job", task))
        scheduler.start()
        wait_for(lambda: len(task.runs) == 1)
        self.assertEqual(failures, ["claimed firings"])
        self.assertIn("claims", threads[0])

    def test_shutdown_requested_is_false_outside_a_stopping_scheduler(self):
        self.assertFalse(shutdown_requested())


class Bursts(SimpleTestCase):
    """A scheduler with 8 threads over a runner in memory, and bursts of tasks due at once."""

    def make(self, runner):
        scheduler = Scheduler(runner, core_pool_size=8, max_pool_size=8)
        self.addCleanup(scheduler.shutdown, DEADLINE)
        return scheduler

    def burst(self, scheduler, count, at, *, prefix="task", trigger=None):
        tasks = []
        for index in range(count):
            task = Task(trigger or FixedRateTrigger(timedelta(hours=1)))
            task.state = TriggerState(anchor=at)
            scheduler.add(Entry(f"{prefix}{index:05}", task))
            tasks.append(task)
        return tasks


class BurstWorkerTests(Bursts):
    def test_runs_that_block_get_every_worker_of_the_pool(self):
        # Workers join a burst one after the other, each asked for by one that took a call
        # while others waited: runs that block still get every worker the pool has, twice
        # over here (16 runs that each wait for 7 others, on 8 workers).
        barrier = threading.Barrier(8, timeout=DEADLINE)
        runner = MemoryRunner()
        scheduler = self.make(runner)
        tasks = self.burst(scheduler, 16, now() + timedelta(milliseconds=100))
        for task in tasks:
            task.action = barrier.wait
        scheduler.start()
        wait_for(lambda: all(task.runs for task in tasks))
        self.assertFalse(barrier.broken)
        self.assertEqual(scheduler.pool.stats().threads, 8)


class ClaimAheadTests(Bursts):
    """A burst (two or more firings due at one instant) is claimed ahead of it; a lone firing
    at its time; nothing starts early."""

    def test_how_far_ahead_grows_with_the_burst_up_to_a_cap(self):
        self.assertEqual(claim_ahead(1), 0.0)
        self.assertAlmostEqual(claim_ahead(BATCH_SIZE), 0.05)
        self.assertAlmostEqual(claim_ahead(1_000), 0.5)
        self.assertAlmostEqual(claim_ahead(10_000), 5.0)
        self.assertEqual(claim_ahead(10**7), CLAIM_AHEAD_MAX)

    def test_a_large_burst_is_claimed_before_its_instant_and_nothing_starts_before_it(self):
        runner = MemoryRunner()
        scheduler = self.make(runner)
        instant = now() + timedelta(seconds=2)
        burst = self.burst(scheduler, 2_000, instant)  # claimed 1 s ahead
        singles = self.burst(scheduler, 3, instant, prefix="single")  # with them
        scheduler.start()
        wait_for(lambda: all(task.runs for task in burst + singles))
        self.assertEqual(len(runner.claims), 2_003)
        self.assertTrue(all(claimed_at < firing for claimed_at, firing in runner.claims))
        self.assertEqual({task.runs[0][0] for task in burst + singles}, {instant})
        self.assertGreaterEqual(min(task.runs[0][1] for task in burst + singles), instant)

    def test_a_burst_of_one_batch_is_claimed_ahead_and_nothing_starts_before_it(self):
        # 100 firings, 50 ms ahead: the claim (for enqueued firings, the enqueues in its
        # transaction) is off the path from the instant to the runs.
        runner = MemoryRunner()
        scheduler = self.make(runner)
        instant = now() + timedelta(milliseconds=300)
        tasks = self.burst(scheduler, BATCH_SIZE, instant)
        scheduler.start()
        wait_for(lambda: all(task.runs for task in tasks))
        self.assertTrue(all(claimed_at < firing for claimed_at, firing in runner.claims))
        self.assertGreaterEqual(min(task.runs[0][1] for task in tasks), instant)

    def test_a_lone_firing_is_claimed_at_its_instant(self):
        runner = MemoryRunner()
        scheduler = self.make(runner)
        instant = now() + timedelta(milliseconds=300)
        self.burst(scheduler, 1, instant)
        scheduler.start()
        wait_for(lambda: runner.claims)
        self.assertGreaterEqual(runner.claims[0][0], instant)

    def test_a_burst_that_grows_as_runs_end_is_claimed_ahead_by_its_final_size(self):
        # Tasks due every second are pushed back one by one as their runs end: the dispatcher,
        # asleep until the first one's time, must learn that a burst has formed.
        # 1,000 firings in the end, to be claimed 500 ms ahead: a margin that a loaded machine's
        # late wake-ups (100 ms and more with the whole suite running) do not use up.
        runner = MemoryRunner()
        scheduler = self.make(runner)
        scheduler.start()
        instant = now() + timedelta(seconds=2)
        tasks = self.burst(scheduler, 1, instant)
        for index in range(999):
            if index % 10 == 0:
                time.sleep(0.002)  # the runs of the second before end over a few hundred ms
            tasks += self.burst(scheduler, 1, instant, prefix=f"later{index:03}-")
        self.assertLess(now(), instant - timedelta(milliseconds=500))  # all in before its time
        wait_for(lambda: all(task.runs for task in tasks))
        self.assertLess(min(claimed_at for claimed_at, _ in runner.claims), instant)
        self.assertGreaterEqual(min(task.runs[0][1] for task in tasks), instant)

    def test_a_burst_is_handed_to_the_pool_as_a_few_items_not_one_per_firing(self):
        # One pool item per claimed firing made thousands of objects at the burst's instant.
        scheduler = self.make(MemoryRunner())
        tasks = self.burst(scheduler, 2_000, now() + timedelta(seconds=2))  # claimed 1 s ahead
        scheduler.start()
        wait_for(lambda: all(task.runs for task in tasks) and not scheduler.pool.stats().active)
        stats = scheduler.pool.stats()
        self.assertEqual(stats.max_size, 8)
        # A few items per hand-over, each drained by one worker: here one hand-over, at the
        # instant, unless a batch's claim ended after it.
        self.assertLessEqual(stats.completed, 8 * 3)
        self.assertEqual(sum(len(task.runs) for task in tasks), 2_000)

    def test_firings_claimed_ahead_still_run_at_their_time_when_the_scheduler_stops(self):
        runner = MemoryRunner()
        scheduler = self.make(runner)
        instant = now() + timedelta(seconds=3)
        tasks = self.burst(scheduler, 2_000, instant)  # claimed 1 s ahead
        scheduler.start()
        wait_for(lambda: len(runner.claims) == 2_000)
        self.assertEqual(scheduler.shutdown(DEADLINE), [])
        self.assertTrue(all(len(task.runs) == 1 for task in tasks))
        self.assertGreaterEqual(min(task.runs[0][1] for task in tasks), instant)


class GatedRunner(MemoryRunner):
    """A runner whose first claims, one per claim thread, wait for ``gate``: the claim threads
    stay busy while a test hands more firings over. It notes the names in each claim."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.batches: list[list[str]] = []

    def dispatch(self, items):
        with self.lock:
            self.batches.append([entry.name for entry, _ in items])
            held = len(self.batches) <= CLAIM_THREADS
        if held:
            self.gate.wait(DEADLINE)
        return super().dispatch(items)


class ClaimOrderTests(Bursts):
    """While the claim threads are busy, what waits for them is claimed the most urgent first,
    and firings that come due a few at a time are claimed together."""

    def hold_the_claim_threads(self, scheduler, runner):
        past = now() - timedelta(seconds=1)
        for index in range(CLAIM_THREADS):
            self.burst(scheduler, 1, past, prefix=f"held{index}-")
            wait_for(functools.partial(lambda count: len(runner.batches) == count, index + 1))

    def wait_until_waiting(self, scheduler, count):
        """Wait until *count* firings wait for a claim thread: all handed over."""
        wait_for(lambda: scheduler.claims.waiting == count)

    def add_one_by_one(self, scheduler, count, at, prefix):
        entries = []
        waiting = scheduler.claims.waiting
        for index in range(count):
            task = Task(FixedRateTrigger(timedelta(hours=1)), state=TriggerState(anchor=at))
            entries.append(Entry(f"{prefix}{index:03}", task))
            scheduler.add(entries[-1])
            self.wait_until_waiting(scheduler, waiting + index + 1)
        return entries

    def first_taken_up(self, runner):
        """The batches the claim threads took up first once free (in either order: each
        thread notes its own)."""
        return runner.batches[CLAIM_THREADS : 2 * CLAIM_THREADS]

    def test_firings_due_a_few_at_a_time_are_claimed_together_while_the_threads_are_busy(self):
        # Runs that end behind their schedule put their entries back already due, one by one:
        # claims of one firing each, a transaction each, fell further behind.
        runner = GatedRunner()
        scheduler = self.make(runner)
        scheduler.start()
        self.hold_the_claim_threads(scheduler, runner)
        late = self.add_one_by_one(scheduler, 30, now() - timedelta(seconds=1), "late")
        runner.gate.set()
        wait_for(lambda: all(entry.payload.runs for entry in late))
        self.assertEqual(len(runner.batches), CLAIM_THREADS + 1)
        self.assertEqual(runner.batches[-1], [entry.name for entry in late])

    def test_a_late_firing_is_claimed_before_a_burst_claimed_ahead(self):
        runner = GatedRunner()
        scheduler = self.make(runner)
        scheduler.start()
        self.hold_the_claim_threads(scheduler, runner)
        burst = self.burst(scheduler, 500, now() + timedelta(seconds=1))  # claimed 250 ms ahead
        self.wait_until_waiting(scheduler, 500)
        late = self.add_one_by_one(scheduler, 1, now() - timedelta(seconds=1), "late")
        runner.gate.set()
        wait_for(lambda: all(task.runs for task in burst) and late[0].payload.runs)
        self.assertIn(["late000"], self.first_taken_up(runner))
        self.assertEqual(sum(map(len, runner.batches[CLAIM_THREADS:])), 501)

    def test_a_late_firing_brings_forward_the_waiting_batch_it_joins(self):
        runner = GatedRunner()
        scheduler = self.make(runner)
        scheduler.start()
        self.hold_the_claim_threads(scheduler, runner)
        instant = now() + timedelta(seconds=1)
        first = self.burst(scheduler, 200, instant, prefix="first")  # 100 ms ahead: 2 batches
        self.wait_until_waiting(scheduler, 200)
        # A burst of one batch, due later, and claimed ahead: a hand-over that others may join.
        later = self.burst(scheduler, 50, instant + timedelta(milliseconds=500), prefix="later")
        self.wait_until_waiting(scheduler, 250)
        self.add_one_by_one(scheduler, 1, now() - timedelta(seconds=1), "late")
        runner.gate.set()
        wait_for(lambda: all(task.runs for task in first + later))
        joined = [f"later{index:05}" for index in range(50)] + ["late000"]
        self.assertIn(joined, self.first_taken_up(runner))

    def test_firings_no_claim_thread_took_up_by_the_stop_are_let_go_not_left_running(self):
        runner = GatedRunner()
        scheduler = self.make(runner)
        scheduler.start()
        self.hold_the_claim_threads(scheduler, runner)
        self.add_one_by_one(scheduler, 5, now() - timedelta(seconds=1), "late")
        self.addCleanup(runner.gate.set)  # the held claims end after the stop gave up on them
        still_running = scheduler.shutdown(0.2)
        self.assertEqual(still_running, [f"held{index}-00000" for index in range(CLAIM_THREADS)])
        self.assertEqual(scheduler.claims.waiting, 0)


class ClaimQueueTests(SimpleTestCase):
    def first_taken_up(self, due, start):
        """Hand *due* over while the claim threads are busy, with its batches beginning at
        *start*; return the first names of the batches the threads take up first, once free."""
        claimed, gate = [], threading.Event()

        def claim(firings):
            claimed.append(firings[0].entry.name)
            if len(claimed) <= CLAIM_THREADS:
                gate.wait(DEADLINE)

        queue = ClaimQueue(
            claim, keep_alive=60.0, name="test-claims", on_exit=None, starts=lambda: start
        )
        self.addCleanup(queue.shutdown, DEADLINE)
        self.addCleanup(gate.set)
        for index in range(CLAIM_THREADS):
            queue.hand_over([Due(Entry(f"held{index}", None), due[0].firing)])
            wait_for(functools.partial(lambda count: len(claimed) == count, index + 1))
        queue.hand_over(due)
        gate.set()
        batches = -(-len(due) // BATCH_SIZE)
        wait_for(lambda: len(claimed) == CLAIM_THREADS + batches)
        return set(claimed[CLAIM_THREADS : 2 * CLAIM_THREADS])

    def test_the_batches_of_one_hand_over_keep_their_rotation_whatever_their_fire_times(self):
        # Every instance cuts the same batches and starts at a batch of its own, so that they
        # claim different rows at the same moment. Ordered by each batch's own earliest time,
        # every instance would start a backlog of mixed times at the same batch.
        base = now() - timedelta(hours=1)
        due = [
            Due(Entry(f"task{index:04}", None), base + timedelta(seconds=index % 600))
            for index in range(1_000)
        ]
        self.assertEqual(self.first_taken_up(due, 0.0), {"task0000", "task0100"})
        self.assertEqual(self.first_taken_up(due, 0.5), {"task0500", "task0600"})

    def test_a_hand_over_is_as_urgent_as_its_earliest_firing_and_a_run_request_most(self):
        later, earlier = now(), now() - timedelta(minutes=1)
        firings = [Due(Entry(name, None), at) for name, at in (("a", later), ("b", later))]
        firings.insert(1, Due(Entry("c", None), earlier))
        self.assertEqual(_earliest(firings), earlier.timestamp())
        self.assertEqual(_earliest([*firings, Due(Entry("d", None), RunRequest())]), 0.0)
