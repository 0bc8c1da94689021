"""How the scheduler keeps its memory small, pinned.

With thousands of tasks, and bursts of thousands of firings, what each task, each firing and
each run costs adds up. The scheduler shares what tasks have alike, instead of a copy each:
their triggers, their options, their trigger states, the times they are due, the parsed
durations and the month tables of their cron expressions; one object per task serves as its
own entry, and trouble (database errors, a lock held elsewhere) costs memory only while it
lasts; locks held together share their extension time, and a claimed run is one object from
its claim to the record of its end. Nor does it keep a burst's objects alive once they have
run, until the next burst.

These tests assert that equal values are the *same object*, that things are shared, and that
objects are not kept alive: behaviour alone would not notice if the sharing went away, only
the memory would. A change that makes one of them fail must say why the sharing is no longer
worth it.
"""

import gc
import time
import weakref
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django.test import SimpleTestCase

from django_scheduling import scheduled
from django_scheduling.conf import get_settings
from django_scheduling.locking import LockConfiguration
from django_scheduling.locking.database import DatabaseLock
from django_scheduling.models import ScheduledTask, TaskLock, TaskRun
from django_scheduling.runtime.calls import Call, Entry
from django_scheduling.runtime.firing import TaskSpec
from django_scheduling.runtime.firing.runs import ClaimedRun
from django_scheduling.runtime.scheduler import Scheduler
from django_scheduling.schedules.cron import CronExpression
from django_scheduling.schedules.durations import parse_duration
from django_scheduling.schedules.triggers import FixedRateTrigger, TriggerState, kept_state
from django_scheduling.tasks import registry as registry_module
from django_scheduling.tasks.registry import TaskRegistry
from django_scheduling.tasks.resolved import resolve

from .test_batches import T0, Counter, Instances
from .test_keepalive import FakeLock, KeeperTestCase
from .test_registry_and_checks import job
from .test_scheduler import Bursts, MemoryRunner, Task, now, wait_for
from .test_triggers import s

# -- triggers, options and durations: shared by the tasks declared alike ---------------------


class DeclaredAlikeTests(SimpleTestCase):
    """Tasks declared with ``@scheduled`` in a registry of their own."""

    def setUp(self):
        saved = registry_module.registry
        registry_module.registry = TaskRegistry()
        self.addCleanup(setattr, registry_module, "registry", saved)

    def test_tasks_declared_alike_share_their_trigger(self):
        zone = ZoneInfo("Europe/Berlin")
        for number in range(3):
            scheduled(cron="*/5 * * * * *", name=f"alike{number}")(job)
        scheduled(cron="*/5 * * * * *", zone="America/New_York", name="new_york")(job)
        scheduled(cron="0/5 * * * * *", name="written_otherwise")(job)
        tasks = registry_module.registry
        first, *others = [tasks.get(f"alike{number}") for number in range(3)]
        for other in others:
            self.assertIs(other.trigger_options, first.trigger_options)
            self.assertIs(other.trigger(zone), first.trigger(zone))
        trigger = first.trigger(zone)
        self.assertIsNot(first.trigger(UTC), trigger)
        self.assertEqual(first.trigger(UTC).zone, UTC)
        self.assertIsNot(first.trigger(zone, timedelta(seconds=6)), trigger)
        self.assertEqual(first.trigger(zone, timedelta(seconds=6)).misfire_threshold.seconds, 6)
        self.assertEqual(tasks.get("new_york").trigger(zone).zone, ZoneInfo("America/New_York"))
        self.assertEqual(
            tasks.get("written_otherwise").trigger(zone).describe(),
            "cron 0/5 * * * * * Europe/Berlin",
        )

    def test_tasks_declared_alike_share_their_options(self):
        # 10,000 tasks declared alike keep one options object, not ten fields each.
        for number in range(3):
            scheduled(fixed_rate="5s", lock_at_most_for="5m", jitter="10s", name=f"o{number}")(job)
        scheduled(fixed_rate="5s", lock_at_most_for="6m", jitter="10s", name="longer")(job)
        scheduled(fixed_rate="5s", lock=False, name="unlocked")(job)
        tasks = registry_module.registry
        first, *others = [tasks.get(f"o{number}") for number in range(3)]
        for other in others:
            self.assertIs(other.options, first.options)
        self.assertIsNot(tasks.get("longer").options, first.options)
        # Read as the definition's own attributes.
        self.assertEqual(
            (first.lock, first.lock_at_most_for, first.jitter, first.engine, first.error),
            (True, timedelta(minutes=5), timedelta(seconds=10), None, None),
        )
        self.assertEqual(tasks.get("longer").lock_at_most_for, timedelta(minutes=6))
        self.assertFalse(tasks.get("unlocked").lock)


def test_the_same_text_or_number_gives_one_timedelta():
    assert parse_duration("10m", name="lock_at_most_for") is parse_duration("10m")
    assert parse_duration(30) is parse_duration(30, name="jitter")
    assert parse_duration(30.0) == parse_duration(30)


def test_expressions_with_the_same_day_fields_share_the_month_masks() -> None:
    # White box: the per-month caches depend on the day fields only, so one is kept for all
    # the expressions that have the same day fields, and filling it for one serves the other.
    daily = CronExpression("0 0 9 13 * FRI")
    hourly = CronExpression("0 0 * 13 * FRI")
    either = CronExpression("0 9 13 * FRI")  # five fields: the 13th or a Friday
    assert daily._masks is hourly._masks
    assert either._masks is not daily._masks
    start = datetime(2024, 1, 1)
    assert daily.next(start) == datetime(2024, 9, 13, 9)
    assert hourly.next(start) == datetime(2024, 9, 13, 0)
    assert either.next(start) == datetime(2024, 1, 5, 9)
    assert daily._seconds is hourly._seconds  # the tables of equal fields are shared too


# -- trigger states: one object for the tasks in the same state ------------------------------


def test_equal_states_are_kept_as_one_object():
    trigger = FixedRateTrigger(s(10))
    first = kept_state(trigger, TriggerState(T0, T0 + s(10), T0 + s(11)))
    second = kept_state(trigger, TriggerState(T0, T0 + s(10), T0 + s(12)))
    assert second is first


class TaskSpecTests(SimpleTestCase):
    """A task keeps what only trouble needs (database errors, a lock held elsewhere) in a
    side object that exists only while there is trouble."""

    def spec(self) -> TaskSpec:
        definition = TaskRegistry().add(lambda: None, fixed_rate="1s", name="job")
        task = resolve(definition, get_settings(), UTC)
        return TaskSpec(name="job", task=task, _state=TriggerState())

    def test_it_is_its_own_entry(self):
        spec = self.spec()
        self.assertIs(spec.payload, spec)
        self.assertIsInstance(spec, Entry)

    def test_trouble_comes_and_goes(self):
        spec = self.spec()
        spec.database_failures = 0
        spec.recheck = None
        self.assertIsNone(spec._trouble)
        spec.database_failures += 1
        spec.recheck = T0
        self.assertEqual((spec.database_failures, spec.recheck), (1, T0))
        self.assertIsNotNone(spec._trouble)
        spec.database_failures = 0
        self.assertEqual(spec.recheck, T0)  # the rest of the trouble stays
        spec.recheck = None
        self.assertIsNone(spec._trouble)
        self.assertEqual(
            (spec.database_failures, spec.recheck, spec.locked_holder), (0, None, None)
        )

    def test_tasks_in_the_same_state_keep_one_state_object(self):
        # After a burst, each task would otherwise keep a state of its own, with the end of
        # its own run, which a fixed-rate trigger never reads.
        first, second = self.spec(), self.spec()
        first.state = TriggerState(T0, T0, T0 + timedelta(milliseconds=3))
        second.state = TriggerState(T0, T0, T0 + timedelta(milliseconds=7))
        self.assertIs(first.state, second.state)
        self.assertEqual(first.state, TriggerState(T0, T0))

    def test_the_end_of_a_run_is_kept_only_by_a_trigger_that_counts_from_it(self):
        rate = self.spec()
        shared = rate.state
        rate.finished(T0)
        self.assertIs(rate.state, shared)  # the fixed rate never reads it
        definition = TaskRegistry().add(lambda: None, fixed_delay="1s", name="delay")
        task = resolve(definition, get_settings(), UTC)
        delay = TaskSpec(name="delay", task=task, _state=TriggerState(T0, T0))
        delay.finished(T0 + timedelta(seconds=3))
        self.assertEqual(delay.state, TriggerState(T0, T0, T0 + timedelta(seconds=3)))


# -- the runner and its writer, on the database ----------------------------------------------


class BatchTests(Instances):
    def test_tasks_declared_alike_share_one_state_at_start_up(self):
        definitions, _ = self.tasks(3)
        other = [self.registry.add(Counter(), name="other", fixed_rate="1m")]
        a = self.instance("a")
        specs = a.runner.specs([*definitions, *other], complete=False)
        self.assertIs(specs[0].state, specs[1].state)
        self.assertIs(specs[0].state, specs[2].state)
        self.assertEqual(specs[3].state, specs[0].state)  # the same values...
        ScheduledTask.objects.filter(name=specs[3].name).update(last_fire_time=T0)
        specs = a.runner.specs([*definitions, *other], complete=False)
        self.assertIsNot(specs[3].state, specs[0].state)  # ...until they differ
        self.assertEqual(specs[3].state.last_fire_time, T0)
        self.assertIsNone(specs[0].state.last_fire_time)

    def handed_ends(self, instance):
        """Note each end handed to *instance*'s writer, with the lock handles alive then, and
        the lock it gave the writer (its own handle, or the batch's)."""
        handed: list = []
        add = instance.writer.add

        def watched(ending):
            handed.append((ending, len(lock_handles()), ending.lock, ending.batch_lock))
            add(ending)

        instance.writer.add = watched
        return handed

    def test_a_claimed_run_is_one_object_from_its_claim_to_the_record_of_its_end(self):
        # A burst keeps every claimed firing in memory at once, and then every end the writer
        # has not written yet: a closure and its cells per run, or an object per end, made
        # each several times larger.
        definitions, counters = self.tasks(5)
        a = self.instance("a")
        entries = a.entries(definitions)
        outcomes = a.batch(entries, T0)
        handed = self.handed_ends(a)
        self.assertEqual(a.run_calls(entries, outcomes), 5)
        self.assertEqual([c.count for c in counters], [1] * 5)
        # The writer takes the run itself, and calls it back once its end is recorded.
        self.assertEqual([id(ending) for ending, *_ in handed], [id(o) for o in outcomes])
        self.assertEqual(TaskRun.objects.filter(lock_lost=True).count(), 0)
        self.assertEqual(set(a.next_times.values()), {T0 + timedelta(seconds=10)})

    def test_a_batch_keeps_one_lock_handle_not_one_per_firing(self):
        # A burst of 10,000 held 10,000 handles, configurations and keep-alive records (about
        # 300 bytes each) from the start of each run to the record of its end; the batch keeps
        # their names, and the writer releases each lock by its name through the one handle.
        definitions, counters = self.tasks(5)
        a = self.instance("a")
        entries = a.entries(definitions)
        before = len(lock_handles())
        outcomes = a.batch(entries, T0)
        self.assertEqual(len({id(run.locks) for run in outcomes}), 1)
        self.assertEqual(len(lock_handles()), before + 1)
        rows = {row.name: row for row in TaskLock.objects.all()}
        for run in outcomes:
            self.assertEqual(run.locked_at, rows[run.name].locked_at)
        handed = self.handed_ends(a)
        self.assertEqual(a.run_calls(entries, outcomes), 5)
        self.assertEqual([c.count for c in counters], [1] * 5)
        for _, handles, lock, batch_lock in handed:
            self.assertEqual(handles, before + 1)  # none made for a run, nor for its end
            self.assertIsNone(lock)
            self.assertIs(batch_lock, handed[0][3])
            self.assertEqual(batch_lock.owner, "a")
        # Each lock was released by its name (none found lost).
        self.assertEqual(TaskRun.objects.filter(lock_lost=True).count(), 0)
        for row in TaskLock.objects.all():
            self.assertLess(row.lock_until, rows[row.name].lock_until)

    def test_an_ended_run_is_freed_without_the_cycle_collector(self):
        # A burst's ended runs are thousands of objects: left in a reference cycle, they would
        # live until the collector's next full pass. Fixed-delay runs write their task rows at
        # their end, a write that refers to the run.
        definitions, counters = self.tasks(5, fixed_rate=None, fixed_delay="10s")
        a = self.instance("a")
        entries = a.entries(definitions)
        gc.collect()
        gc.disable()
        self.addCleanup(gc.enable)
        outcomes = a.batch(entries, T0)
        self.assertEqual(a.run_calls(entries, outcomes), 5)
        self.assertEqual([c.count for c in counters], [1] * 5)
        self.assertEqual(len(a.next_times), 5)
        del outcomes
        specs = {id(entry.payload) for entry in entries}  # not another test's runs
        left = [o for o in gc.get_objects() if type(o) is ClaimedRun and id(o.spec) in specs]
        self.assertEqual(left, [])


def lock_handles():
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is DatabaseLock]


# -- locks held together ---------------------------------------------------------------------


class KeepAliveTests(KeeperTestCase):
    def keep(self, most="400ms", least=0, **options):
        config = LockConfiguration("job", most, least)
        return self.keeper.hold(FakeLock(config, self.calls, **options), "job")

    def test_locks_held_together_share_their_extension_time(self):
        # A burst claimed ahead holds thousands of locks at once: one float each added up.
        before = time.monotonic()
        kept = [self.keep(most="1h") for _ in range(200)]
        after = time.monotonic()
        self.assertLessEqual(len({id(k.due) for k in kept}), 5)  # a new one each 10 ms at most
        for k in kept:
            self.assertGreaterEqual(k.due, before + 1800)  # half of lock_at_most_for
            self.assertLessEqual(k.due, after + 1800 + 0.01)
        for k in kept:
            k.release()


# -- the scheduler's queue and bursts --------------------------------------------------------


class SchedulerTests(SimpleTestCase):
    def make(self, **options):
        runner = MemoryRunner()
        scheduler = Scheduler(runner, **options)
        self.addCleanup(scheduler.shutdown, 5)
        return runner, scheduler

    def test_entries_due_at_the_same_time_share_one_time_object(self):
        _runner, scheduler = self.make()
        anchor = now() + timedelta(hours=1)
        tasks = [Task(FixedRateTrigger(timedelta(hours=1))) for _ in range(3)]
        for index, task in enumerate(tasks):
            task.state = TriggerState(anchor=anchor.replace(microsecond=anchor.microsecond))
            scheduler.add(Entry(f"task{index}", task))
        later = Task(FixedRateTrigger(timedelta(hours=2)))
        later.state = TriggerState(anchor=anchor + timedelta(minutes=1))
        scheduler.add(Entry("later", later))
        times = {entry.name: entry.next_fire_time for entry in scheduler.entries()}
        self.assertEqual(times["task0"], anchor)
        self.assertIs(times["task1"], times["task0"])
        self.assertIs(times["task2"], times["task0"])
        self.assertEqual(times["later"], anchor + timedelta(minutes=1))

    def test_entries_due_together_cost_one_heap_item(self):
        # The heap holds a time once, with a list of the entries due then: a burst of tasks
        # costs a list slot each, not a heap item each.
        _runner, scheduler = self.make()
        at = now() + timedelta(hours=1)
        for index in range(1_000):
            task = Task(FixedRateTrigger(timedelta(hours=1)), state=TriggerState(anchor=at))
            scheduler.add(Entry(f"task{index:04}", task))
        self.assertEqual(len(scheduler.queue.state.heap), 1)
        due, _ = scheduler.queue.pop(at.timestamp(), at.timestamp())
        self.assertEqual(
            sorted(work.entry.name for work in due), [f"task{i:04}" for i in range(1_000)]
        )

    def test_every_call_is_told_of_its_end_by_one_callable(self):
        # A callable made per call (a partial and its bound method, 144 bytes) stayed with
        # each run until the writer recorded its end.
        _runner, scheduler = self.make()
        told = []

        class Watched(Call):
            __slots__ = ()

            def run(self, done):
                told.append(done)
                done(self, None)

        calls = []
        for index in range(3):
            call = Watched()
            at = now() + timedelta(hours=1)
            task = Task(FixedRateTrigger(timedelta(hours=1)), state=TriggerState(anchor=at))
            call.entry = Entry(f"task{index}", task)
            scheduler.add(call.entry)
            calls.append(call)
        for call in calls:
            scheduler._run_call(call)
        self.assertEqual(len(told), 3)
        self.assertEqual(len({id(done) for done in told}), 1)


class ClaimAheadTests(Bursts):
    """What a burst claimed ahead of its instant leaves in memory."""

    def test_the_calls_of_a_burst_are_not_kept_once_they_have_run(self):
        # A call holds its run's lock and records: kept by the dispatcher or by an idle
        # worker, a burst of 10,000 stayed in memory until the next burst.
        runner = MemoryRunner()
        scheduler = self.make(runner)
        instant = now() + timedelta(seconds=2)
        tasks = self.burst(scheduler, 2_000, instant)  # claimed 1 s ahead
        kept = []
        dispatch = runner.dispatch

        def watched_dispatch(items):
            calls = dispatch(items)
            kept.extend(weakref.ref(call.fn) for call in calls)
            return calls

        runner.dispatch = watched_dispatch
        scheduler.start()
        wait_for(lambda: all(task.runs for task in tasks))
        self.assertEqual(len(kept), 2_000)
        wait_for(lambda: scheduler.pool.stats().active == 0)
        wait_for(lambda: not any(ref() for ref in kept))
