"""The trends of the admin, without a database: run figures, the timeline's firings and the SVG
charts."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django.test import SimpleTestCase
from django.utils import timezone

from django_scheduling.admin import charts
from django_scheduling.admin.trends import RunPoint, percentile, run_points, run_stats
from django_scheduling.schedules.timeline import (
    Firing,
    TaskPlan,
    Timeline,
    busiest_minutes,
    plan_firings,
)
from django_scheduling.schedules.triggers import TriggerState, make_trigger

NOW = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)
SCRIPT_NAME = "<script>alert(1)</script> & co"


def row(run_id, status, *, ago, duration=None, late=timedelta(0), manual=False, waited=None):
    """Return a run's row as the admin reads it: (id, status, started, scheduled, duration,
    finished). The task began *waited* after its start was recorded (a wait for a thread)."""
    started = NOW - ago
    scheduled = None if manual else started - late
    began = started + (waited or timedelta(0))
    finished = None if duration is None else began + duration
    return (run_id, status, started, scheduled, duration, finished)


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


class RunPointsTests(SimpleTestCase):
    def test_oldest_first_with_lateness_and_the_elapsed_time_of_a_running_run(self):
        rows = [  # newest first, as read
            row(3, "running", ago=seconds(5)),
            row(2, "succeeded", ago=seconds(60), duration=seconds(2), late=seconds(1.5)),
            row(1, "failed", ago=seconds(120), duration=seconds(1), late=seconds(1)),
            row(0, "succeeded", ago=seconds(180), duration=seconds(1), manual=True),
        ]

        points = run_points(rows, now=NOW, late_after=seconds(1))

        self.assertEqual([p.id for p in points], [0, 1, 2, 3])
        self.assertEqual([p.late for p in points], [False, False, True, False])
        self.assertIsNone(points[0].lateness)  # a manual run serves no fire time
        self.assertEqual(points[2].lateness, seconds(1.5))
        self.assertEqual(points[3].duration, seconds(5))  # running: so far
        self.assertTrue(points[3].in_progress)

    def test_a_run_that_waited_for_a_thread_is_as_late_as_when_the_task_began(self):
        rows = [
            row(2, "succeeded", ago=seconds(60), duration=seconds(2), waited=seconds(3)),
            row(1, "failed", ago=seconds(120), duration=seconds(1), waited=seconds(0.5)),
        ]

        waited_long, waited_short = reversed(run_points(rows, now=NOW, late_after=seconds(1)))

        self.assertEqual(waited_long.lateness, seconds(3))
        self.assertTrue(waited_long.late)
        self.assertEqual(waited_long.started_at, NOW - seconds(57))
        self.assertEqual(waited_short.lateness, seconds(0.5))
        self.assertFalse(waited_short.late)

    def test_a_rejected_run_never_began_and_is_late_by_its_recorded_start_only(self):
        # Turned away by the pool 3 s after its start was recorded, on time.
        rows = [row(1, "rejected", ago=seconds(60), duration=seconds(0), waited=seconds(3))]
        (point,) = run_points(rows, now=NOW, late_after=seconds(1))
        self.assertEqual(point.lateness, seconds(0))
        self.assertFalse(point.late)

    def test_an_enqueued_run_has_ended_with_the_duration_of_its_enqueue(self):
        (point,) = run_points([row(1, "enqueued", ago=seconds(3), duration=seconds(0.2))], now=NOW)
        self.assertFalse(point.in_progress)
        self.assertEqual(point.duration, seconds(0.2))
        stats = run_stats([point])
        self.assertEqual((stats.finished, stats.succeeded, stats.p50), (1, 1, seconds(0.2)))


class RunStatsTests(SimpleTestCase):
    def stats(self, *statuses: str, durations: list[float] | None = None):
        durations = durations or [1.0] * len(statuses)
        rows = [
            row(i, status, ago=seconds(100 - i), duration=seconds(d))
            for i, (status, d) in enumerate(zip(statuses, durations, strict=True))
        ]
        rows.reverse()
        return run_stats(run_points(rows, now=NOW))

    def test_success_rate_of_the_finished_runs(self):
        stats = self.stats("succeeded", "failed", "succeeded", "succeeded", "running")
        self.assertEqual((stats.runs, stats.finished, stats.succeeded), (5, 4, 3))
        self.assertEqual(stats.success_rate, 0.75)

    def test_an_enqueue_is_a_success_of_an_engine_task(self):
        stats = self.stats("failed", "enqueued", "failed", "enqueued")
        self.assertEqual((stats.finished, stats.succeeded), (4, 2))
        self.assertEqual(stats.success_rate, 0.5)
        self.assertEqual(stats.consecutive_failures, 0)
        stats = self.stats("enqueued", "failed", "enqueued", "failed")
        self.assertEqual(stats.success_rate, 0.5)
        self.assertEqual(stats.consecutive_failures, 1)  # not 2: an enqueue came between

    def test_no_finished_run_has_no_rate(self):
        stats = run_stats([])
        self.assertIsNone(stats.success_rate)
        self.assertIsNone(stats.p50)
        self.assertEqual(stats.consecutive_failures, 0)

    def test_p50_and_p95_are_durations_that_occurred(self):
        stats = self.stats(*["succeeded"] * 20, durations=[float(d) for d in range(1, 21)])
        self.assertEqual(stats.p50, seconds(10))
        self.assertEqual(stats.p95, seconds(19))
        single = self.stats("failed", durations=[3.0])
        self.assertEqual((single.p50, single.p95), (seconds(3), seconds(3)))

    def test_the_running_run_is_left_out_of_the_durations(self):
        stats = self.stats("succeeded", "running", durations=[1.0, 500.0])
        self.assertEqual(stats.p95, seconds(1))

    def test_consecutive_failures_count_back_to_the_last_success(self):
        cases = [
            (("succeeded", "failed", "lost", "timed_out"), 3),
            (("failed", "succeeded"), 0),
            (("failed", "enqueued"), 0),
            # Interrupted and rejected runs count neither way: the task did not get to run.
            (("failed", "interrupted", "failed", "rejected"), 2),
            (("succeeded", "failed", "failed", "running"), 2),  # the run in progress is passed
            (("failed", "failed"), 2),
        ]
        for statuses, expected in cases:
            with self.subTest(statuses):
                self.assertEqual(self.stats(*statuses).consecutive_failures, expected)

    def test_late_starts(self):
        rows = [
            row(2, "succeeded", ago=seconds(10), duration=seconds(1), late=seconds(30)),
            row(1, "succeeded", ago=seconds(20), duration=seconds(1), late=seconds(3)),
        ]
        self.assertEqual(run_stats(run_points(rows, now=NOW)).late_starts, 2)
        lenient = run_points(rows, now=NOW, late_after=seconds(10))  # a task with jitter
        self.assertEqual(run_stats(lenient).late_starts, 1)

    def test_percentile_nearest_rank(self):
        values = [seconds(v) for v in (1, 2, 3, 4)]
        self.assertEqual(percentile(values, 0.5), seconds(2))
        self.assertEqual(percentile(values, 0.95), seconds(4))
        self.assertEqual(percentile(values, 0.0), seconds(1))
        self.assertIsNone(percentile([], 0.5))


def plan(name, *, state=None, jitter=timedelta(0), next_fire_time=None, **options):
    trigger = make_trigger(**options) if options else None
    return TaskPlan(name, trigger, state or TriggerState(anchor=NOW), jitter, next_fire_time)


class PlanFiringsTests(SimpleTestCase):
    def test_cron_and_fixed_rate_tasks_firing_together(self):
        plans = [
            plan("hourly", cron="0 0 * * * *"),
            plan("every_30m", fixed_rate="30m", state=TriggerState(anchor=NOW)),
        ]

        timeline = plan_firings(plans, now=NOW, horizon=timedelta(hours=2))

        times = [(f.at.strftime("%H:%M"), f.name) for f in timeline.firings]
        self.assertEqual(
            times,
            [
                ("12:00", "every_30m"),
                ("12:30", "every_30m"),
                ("13:00", "every_30m"),
                ("13:00", "hourly"),
                ("13:30", "every_30m"),
            ],
        )
        self.assertEqual(timeline.complete_until, timeline.end)
        self.assertEqual(timeline.tasks, 2)

    def test_a_cron_task_over_the_dst_change_in_berlin(self):
        # 2026-03-29: 02:00 CET becomes 03:00 CEST; "30 2 * * *" has no match that day.
        daily = plan("daily", cron="0 30 2 * * *", zone="Europe/Berlin")
        timeline = plan_firings([daily], now=NOW, horizon=timedelta(days=3))
        berlin = [f.at.astimezone(ZoneInfo("Europe/Berlin")).isoformat() for f in timeline.firings]
        self.assertEqual(berlin, ["2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"])

    def test_a_new_york_task_on_the_day_clocks_go_back(self):
        now = datetime(2026, 11, 1, 4, 0, tzinfo=UTC)  # 00:00 EDT; 02:00 EDT becomes 01:00 EST
        hourly = plan(
            "ny", cron="0 0 * * * *", zone="America/New_York", state=TriggerState(anchor=now)
        )
        timeline = plan_firings([hourly], now=now, horizon=timedelta(hours=4))
        # 01:00 EDT, 01:00 EST and 02:00 EST: every hour of the day, the repeated one too.
        self.assertEqual(
            [f.at.strftime("%H:%M") for f in timeline.firings], ["05:00", "06:00", "07:00"]
        )

    def test_each_task_is_capped_and_the_timeline_ends_where_it_is_complete(self):
        fast = plan("fast", fixed_rate="1s")
        slow = plan("slow", fixed_rate="1m")
        timeline = plan_firings([fast, slow], now=NOW, per_task=200, horizon=timedelta(hours=1))
        self.assertEqual(timeline.capped, {"fast": NOW + seconds(199)})
        # Complete until the fast task's last firing: the slow one's later firings are left out.
        self.assertEqual(timeline.complete_until, NOW + seconds(199))
        self.assertEqual(timeline.shown_until, NOW + seconds(199))
        self.assertEqual(len([f for f in timeline.firings if f.name == "fast"]), 200)
        self.assertEqual(
            [f.at for f in timeline.firings if f.name == "slow"],
            [NOW + timedelta(minutes=m) for m in range(4)],
        )

    def test_no_cap_reported_when_the_last_firing_is_the_last_in_the_window(self):
        timeline = plan_firings(
            [plan("t", fixed_rate="1h")], now=NOW, horizon=timedelta(hours=2), per_task=2
        )
        self.assertEqual(len(timeline.firings), 2)
        self.assertEqual(timeline.capped, {})

    def test_the_total_cap_stops_the_timeline_where_it_is_complete(self):
        plans = [plan(f"t{i}", fixed_rate="1m") for i in range(3)]
        timeline = plan_firings(plans, now=NOW, total=10)
        self.assertEqual(len(timeline.firings), 10)
        # Every firing before the stop is there: 4 minutes of three tasks would be 12.
        self.assertEqual(timeline.complete_until, NOW + timedelta(minutes=3))
        self.assertEqual(
            {f.at for f in timeline.firings if f.name == "t0"},
            set(NOW + timedelta(minutes=m) for m in range(4)),
        )

    def test_a_due_firing_shows_at_now_and_the_next_follows_the_trigger(self):
        overdue = TriggerState(anchor=NOW - timedelta(hours=1), last_fire_time=None)
        timeline = plan_firings(
            [plan("late", fixed_rate="1h", state=overdue)], now=NOW, horizon=timedelta(hours=1)
        )
        self.assertEqual([f.at for f in timeline.firings], [NOW])  # coalesced: 11:00 runs now

    def test_a_fixed_delay_task_runs_are_taken_as_instant(self):
        state = TriggerState(
            anchor=NOW, last_fire_time=NOW - seconds(100), last_finished=NOW - seconds(40)
        )
        timeline = plan_firings(
            [plan("delay", fixed_delay="1m", state=state)], now=NOW, horizon=timedelta(minutes=3)
        )
        self.assertEqual(
            [f.at - NOW for f in timeline.firings], [seconds(20), seconds(80), seconds(140)]
        )

    def test_a_one_shot_fires_once_and_not_after_it_ran(self):
        at = NOW + timedelta(hours=2)
        self.assertEqual(len(plan_firings([plan("once", at=at)], now=NOW).firings), 1)
        ran = TriggerState(anchor=at, last_fire_time=at)
        self.assertEqual(plan_firings([plan("once", at=at, state=ran)], now=NOW).firings, [])

    def test_jitter_delays_each_firing_by_its_offset(self):
        jittered = plan("j", cron="0 0 * * * *", jitter=timedelta(minutes=5))
        timeline = plan_firings([jittered], now=NOW, horizon=timedelta(hours=3))
        self.assertEqual(len(timeline.firings), 2)
        for firing in timeline.firings:
            self.assertEqual(firing.at.minute // 5, 0)
            self.assertNotEqual(firing.at.replace(minute=0, second=0, microsecond=0), firing.at)

    def test_a_task_without_a_known_trigger_shows_its_stored_next_fire_time(self):
        stored = NOW + timedelta(minutes=7)
        timeline = plan_firings([plan("elsewhere", next_fire_time=stored)], now=NOW)
        self.assertEqual(timeline.firings, [Firing(stored, "elsewhere")])
        self.assertEqual(timeline.unknown, ["elsewhere"])


class BusiestMinutesTests(SimpleTestCase):
    def test_busiest_minutes_in_time_order_with_the_instant_they_share(self):
        at = NOW + timedelta(hours=1)
        firings = [Firing(at, f"t{i}") for i in range(3)]
        firings += [Firing(at + seconds(30), "t9")]
        firings += [Firing(NOW + timedelta(hours=2), "lonely")]
        firings += [
            Firing(NOW + timedelta(minutes=5), "a"),
            Firing(NOW + timedelta(minutes=5, seconds=1), "b"),
        ]

        minutes, total = busiest_minutes(sorted(firings, key=lambda f: f.at), limit=2)

        self.assertEqual(total, 3)
        self.assertEqual(
            [(m.start, m.count, m.together) for m in minutes],
            [
                (NOW + timedelta(minutes=5), 2, 1),
                (at, 4, 3),
            ],
        )
        self.assertEqual(minutes[1].instant, at)
        self.assertEqual(minutes[1].names, ["t0", "t1", "t2", "t9"])


class ChartTests(SimpleTestCase):
    def points(self, *statuses: str) -> list[RunPoint]:
        rows = [
            row(i, status, ago=seconds(1000 - i), duration=seconds(i + 1), late=seconds(i % 3))
            for i, status in enumerate(statuses)
        ]
        rows.reverse()
        return run_points(rows, now=NOW)

    def test_one_bar_per_run_coloured_by_outcome_and_a_mark_per_late_start(self):
        statuses = ["succeeded", "failed", "lost", "interrupted", "rejected", "running", "enqueued"]
        svg = charts.run_chart(self.points(*statuses))

        bars = re.findall(r'<rect class="ds-bar" data-status="(\w+)" fill="(#\w+)"', svg)
        self.assertEqual([status for status, _ in bars], statuses)
        self.assertEqual(bars[1][1], charts.STATUS_COLOURS["failed"])
        self.assertEqual(bars[6][1], charts.STATUS_COLOURS["enqueued"])
        late = [p for p in self.points(*statuses) if p.late]
        self.assertEqual(svg.count('class="ds-late"'), len(late))
        self.assertEqual(len(late), 2)  # started 2 s late: runs 2 and 5
        self.assertNotIn("<script", svg)

    def test_an_unknown_status_is_grey_and_named_as_it_is(self):
        svg = charts.run_chart(self.points("paused_for_lunch"))
        self.assertIn(f'fill="{charts.OTHER_COLOUR}"', svg)
        self.assertIn("paused_for_lunch", svg)

    def test_the_longest_run_fills_the_height_and_labels_the_axis(self):
        svg = charts.run_chart(self.points("succeeded", "succeeded"))  # 1 s and 2 s
        heights = [float(h) for h in re.findall(r'class="ds-bar"[^>]*height="([\d.]+)"', svg)]
        self.assertAlmostEqual(heights[1], heights[0] * 2, places=0)
        self.assertIn(">2.00s</text>", svg)

    def test_sparkline_ticks_and_summary(self):
        svg = charts.sparkline(self.points("succeeded", "failed", "succeeded"), slots=20)
        self.assertEqual(svg.count('class="ds-tick"'), 3)
        self.assertIn("Last 3 runs: 2 succeeded, 1 failed", svg)

    def test_timeline_strip_marks_collisions_and_escapes_nothing_it_should_not(self):
        at = NOW + timedelta(hours=1)
        timeline = Timeline(
            NOW,
            NOW + timedelta(hours=24),
            [Firing(at, SCRIPT_NAME), Firing(at, "b"), Firing(NOW + timedelta(hours=5), "c")],
        )
        svg = charts.timeline_strip(timeline)
        slots = re.findall(r'<rect class="([\w -]+)" data-count="(\d+)"', svg)
        self.assertEqual(slots, [("ds-slot ds-slot--collision", "2"), ("ds-slot", "1")])
        self.assertIn("2 tasks at one instant", svg)
        self.assertNotIn("<script", svg)

    def test_timeline_strip_bars_start_on_the_clock_across_a_change_of_the_clocks(self):
        start = datetime(2026, 3, 28, 23, 3, 40, tzinfo=UTC)  # 00:03:40 CET; 02:00 -> 03:00
        timeline = Timeline(start, start + timedelta(hours=24), [Firing(start, "a")])
        with timezone.override(ZoneInfo("Europe/Berlin")):
            svg = charts.timeline_strip(timeline)
        labels = re.findall(r'<text x="([\d.]+)" y="\d+" text-anchor="middle">([\d:]+)<', svg)
        self.assertEqual([text for _, text in labels[:3]], ["00:00", "03:00", "06:00"])
        # 00:00 CET to 03:00 CEST is two hours: twelve bars of ten minutes.
        slot = (float(labels[2][0]) - float(labels[1][0])) / 18
        self.assertAlmostEqual(float(labels[1][0]) - float(labels[0][0]), 12 * slot, delta=0.2)
        self.assertIn("00:00:00 CET to 2026-03-29 00:10:00 CET: 1 firing", svg)

    def test_a_long_run_in_progress_does_not_flatten_the_chart(self):
        rows = [
            row(2, "running", ago=timedelta(hours=1)),
            row(1, "succeeded", ago=timedelta(hours=2), duration=seconds(2)),
            row(0, "succeeded", ago=timedelta(hours=3), duration=seconds(1)),
        ]
        svg = charts.run_chart(run_points(rows, now=NOW))
        heights = [float(h) for h in re.findall(r'class="ds-bar"[^>]*height="([\d.]+)"', svg)]
        self.assertEqual(heights[2], heights[1])  # the top of the chart
        self.assertAlmostEqual(heights[0] * 2, heights[1], places=0)
        self.assertIn(">2.00s</text>", svg)
        self.assertIn("running · 2026-03-28 11:00:00 UTC · 1h<", svg)  # its tooltip
