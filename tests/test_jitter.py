"""``jitter=``: each firing waits a deterministic offset, the same on every instance."""

import io
from datetime import UTC, datetime, timedelta
from unittest import mock

from django.core.management import call_command
from django.test import SimpleTestCase, TestCase, TransactionTestCase, override_settings

from django_scheduling import current_fire_time
from django_scheduling.models import ScheduledTask, TaskRun
from django_scheduling.runtime.scheduler import Entry
from django_scheduling.schedules.triggers import jitter_offset
from django_scheduling.tasks.registry import TaskRegistry

from .test_execution import Clock, make_runner

T0 = datetime(2026, 5, 13, 9, 0, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
JITTER = timedelta(seconds=30)


class OffsetTests(SimpleTestCase):
    def test_the_offset_is_the_same_for_the_same_task_and_fire_time(self):
        self.assertEqual(jitter_offset("a", T0, JITTER), jitter_offset("a", T0, JITTER))
        # The same instant in another zone is the same fire time.
        berlin = T0.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
        self.assertEqual(jitter_offset("a", berlin, JITTER), jitter_offset("a", T0, JITTER))

    def test_offsets_fall_in_the_jitter_and_spread_a_burst(self):
        offsets = [jitter_offset(f"task{n}", T0, JITTER) for n in range(3000)]
        self.assertTrue(all(timedelta(0) <= o < JITTER for o in offsets))
        # Spread evenly: each 3-second slice of the 30 s gets about a tenth of the tasks.
        slices = [0] * 10
        for offset in offsets:
            slices[int(offset / timedelta(seconds=3))] += 1
        self.assertTrue(all(200 < count < 400 for count in slices), slices)
        # A task's offset changes from one fire time to the next.
        later = {jitter_offset("task0", T0 + n * MINUTE, JITTER) for n in range(20)}
        self.assertGreater(len(later), 15)

    def test_no_jitter_no_offset(self):
        self.assertEqual(jitter_offset("a", T0, timedelta(0)), timedelta(0))


class JitteredFiringTests(TransactionTestCase):
    def test_a_jittered_firing_serves_its_fire_time_once_across_instances(self):
        seen = []
        registry = TaskRegistry()
        definition = registry.add(
            lambda: seen.append(current_fire_time()), cron="0 * * * * *", name="job", jitter="30s"
        )
        clock = Clock(T0 - timedelta(seconds=1))
        a, b = make_runner("a", clock), make_runner("b", clock)
        (spec_a,) = a.specs([definition], complete=False)
        (spec_b,) = b.specs([definition], complete=False)
        entry_a, entry_b = Entry("job", spec_a), Entry("job", spec_b)
        offset = jitter_offset("job", T0, JITTER)
        wake = T0 + offset
        # Both instances wake at the same moment, after the fire time by its offset.
        self.assertEqual(a.first_fire_time(entry_a, now=clock()), wake)
        self.assertEqual(b.first_fire_time(entry_b, now=clock()), wake)
        clock.now = wake
        next_a = a.run(entry_a, wake)
        next_b = b.run(entry_b, wake)
        self.assertEqual(seen, [T0])  # the fire time, not the moment it was dispatched
        self.assertEqual(TaskRun.objects.get().scheduled_at, T0)
        following = T0 + MINUTE + jitter_offset("job", T0 + MINUTE, JITTER)
        self.assertEqual((next_a, next_b), (following, following))
        # The admin shows the next firing after its jitter.
        self.assertEqual(ScheduledTask.objects.get(name="job").next_fire_time, following)

    @override_settings(SCHEDULING={"JITTER": "30s", "MISFIRE_THRESHOLD": "1s"})
    def test_a_jittered_firing_is_not_counted_as_missed(self):
        seen = []
        registry = TaskRegistry()
        # missed="skip" would drop a fire time late by more than the threshold.
        definition = registry.add(
            lambda: seen.append(current_fire_time()), cron="0 * * * * *", name="job", missed="skip"
        )
        clock = Clock(T0 - timedelta(seconds=1))
        runner = make_runner("a", clock)
        (spec,) = runner.specs([definition], complete=False)
        entry = Entry("job", spec)
        wake = runner.first_fire_time(entry, now=clock())
        self.assertGreater(wake - T0, timedelta(seconds=1), "pick a name with a larger offset")
        clock.now = wake
        runner.run(entry, wake)
        self.assertEqual(seen, [T0])


class JitterOptionTests(TestCase):
    def test_a_negative_jitter_is_reported(self):
        definition = TaskRegistry().add(lambda: None, cron="@hourly", jitter="-5s", name="a")
        self.assertIn("jitter must not be negative", definition.error)

    def test_list_shows_the_fire_time_after_jitter(self):
        registry = TaskRegistry()
        registry.add(lambda: None, cron="0 0 * * * *", name="hourly", jitter="10m")
        out = io.StringIO()
        now = datetime(2026, 5, 13, 9, 30, tzinfo=UTC)
        hour = datetime(2026, 5, 13, 10, 0, tzinfo=UTC)
        expected = hour + jitter_offset("hourly", hour, timedelta(minutes=10))
        module = "django_scheduling.management.commands.runscheduler"
        with (
            mock.patch(f"{module}.registry", registry),
            mock.patch("django.utils.timezone.now", return_value=now),
        ):
            call_command("runscheduler", "--list", stdout=out, stderr=io.StringIO())
        self.assertIn(f"next {expected.isoformat(timespec='seconds')}", out.getvalue())
