"""Triggers compute fire times from their arguments only: every test passes explicit times."""

import dataclasses
import pickle
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from django_scheduling.schedules.cron import CronExpression, InvalidCronExpression
from django_scheduling.schedules.triggers import (
    CronTrigger,
    FixedDelayTrigger,
    FixedRateTrigger,
    MissedRuns,
    OneShotTrigger,
    TriggerState,
    kept_state,
    make_trigger,
)

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


class TestFixedRate:
    trigger = FixedRateTrigger(period=s(10))

    def test_first_fire_time_is_the_anchor(self):
        assert self.trigger.next_fire_time(now=T0, state=TriggerState(anchor=T0)) == T0

    def test_without_an_anchor_it_starts_now_plus_the_initial_delay(self):
        trigger = FixedRateTrigger(period=s(10), initial_delay=s(3))
        assert trigger.initial_anchor(now=T0) == T0 + s(3)
        assert trigger.next_fire_time(now=T0, state=TriggerState()) == T0 + s(3)

    def test_next_slot_on_the_grid_after_a_short_run(self):
        state = TriggerState(anchor=T0, last_fire_time=T0 + s(20), last_finished=T0 + s(21))
        assert self.trigger.next_fire_time(now=T0 + s(21), state=state) == T0 + s(30)

    def test_the_grid_does_not_drift_with_late_starts(self):
        # Fire times stay on anchor + k*period even when the claim happened late.
        state = TriggerState(anchor=T0, last_fire_time=T0 + s(20))
        assert self.trigger.next_fire_time(now=T0 + s(24.9), state=state) == T0 + s(30)

    def test_overran_run_coalesces_missed_slots_into_one(self):
        # Ran slot 0; it ended at 35 s: slots 10, 20, 30 were missed; run once for 30 now.
        state = TriggerState(anchor=T0, last_fire_time=T0, last_finished=T0 + s(35))
        assert self.trigger.next_fire_time(now=T0 + s(35), state=state) == T0 + s(30)

    def test_run_all_runs_every_missed_slot_in_turn(self):
        trigger = FixedRateTrigger(period=s(10), missed=MissedRuns.RUN_ALL)
        state = TriggerState(anchor=T0, last_fire_time=T0)
        assert trigger.next_fire_time(now=T0 + s(35), state=state) == T0 + s(10)
        state = TriggerState(anchor=T0, last_fire_time=T0 + s(10))
        assert trigger.next_fire_time(now=T0 + s(36), state=state) == T0 + s(20)

    def test_skip_drops_missed_slots(self):
        trigger = FixedRateTrigger(period=s(10), missed=MissedRuns.SKIP)
        state = TriggerState(anchor=T0, last_fire_time=T0)
        assert trigger.next_fire_time(now=T0 + s(35), state=state) == T0 + s(40)

    def test_skip_keeps_a_slot_that_is_exactly_now(self):
        trigger = FixedRateTrigger(period=s(10), missed=MissedRuns.SKIP)
        state = TriggerState(anchor=T0, last_fire_time=T0)
        assert trigger.next_fire_time(now=T0 + s(10), state=state) == T0 + s(10)

    def test_a_fire_time_late_by_less_than_the_threshold_still_runs(self):
        # Slot 10 s is 3 s late at 13 s: below the 5 s threshold it runs, it is not coalesced
        # away. This is also what an instance whose clock runs 3 s ahead sees.
        state = TriggerState(anchor=T0, last_fire_time=T0)
        assert self.trigger.next_fire_time(now=T0 + s(13), state=state) == T0 + s(10)
        skip = FixedRateTrigger(period=s(1), missed=MissedRuns.SKIP)
        assert skip.next_fire_time(now=T0 + s(4), state=state) == T0 + s(1)

    def test_the_threshold_is_configurable(self):
        strict = FixedRateTrigger(period=s(10), misfire_threshold=timedelta(0))
        state = TriggerState(anchor=T0, last_fire_time=T0)
        assert strict.next_fire_time(now=T0 + s(13), state=state) == T0 + s(10)  # newest <= now
        assert strict.next_fire_time(now=T0 + s(23), state=state) == T0 + s(20)
        lenient = make_trigger(fixed_rate="10s", misfire_threshold=timedelta(minutes=1))
        assert lenient.next_fire_time(now=T0 + s(35), state=state) == T0 + s(10)

    def test_a_long_outage_coalesces_to_the_newest_slot(self):
        state = TriggerState(anchor=T0, last_fire_time=T0)
        now = T0 + timedelta(days=3, seconds=7)
        assert self.trigger.next_fire_time(now=now, state=state) == T0 + timedelta(days=3)

    def test_describe(self):
        assert FixedRateTrigger(s(30)).describe() == "every 30s"
        assert FixedRateTrigger(s(90), s(5)).describe() == "every 1m30s, first after 5s"


class TestFixedDelay:
    trigger = FixedDelayTrigger(delay=s(5))

    def test_first_run_after_initial_delay(self):
        trigger = FixedDelayTrigger(delay=s(5), initial_delay=s(2))
        assert trigger.next_fire_time(now=T0, state=TriggerState()) == T0 + s(2)

    def test_next_run_counts_from_the_finish(self):
        state = TriggerState(anchor=T0, last_fire_time=T0, last_finished=T0 + s(7))
        assert self.trigger.next_fire_time(now=T0 + s(7), state=state) == T0 + s(12)

    def test_a_run_that_never_finished_counts_from_its_start(self):
        state = TriggerState(anchor=T0, last_fire_time=T0 + s(30), last_finished=T0 + s(7))
        assert self.trigger.next_fire_time(now=T0 + s(100), state=state) == T0 + s(35)

    def test_fixed_rate_and_fixed_delay_differ_after_a_slow_run(self):
        rate = FixedRateTrigger(period=s(5))
        state = TriggerState(anchor=T0, last_fire_time=T0, last_finished=T0 + s(3))
        assert rate.next_fire_time(now=T0 + s(3), state=state) == T0 + s(5)
        assert self.trigger.next_fire_time(now=T0 + s(3), state=state) == T0 + s(8)


class TestCron:
    def test_first_match_after_the_anchor(self):
        trigger = CronTrigger(CronExpression.parse("0 */15 * * * *"), UTC)
        state = TriggerState(anchor=T0 + s(1))
        assert trigger.next_fire_time(now=T0 + s(1), state=state) == T0 + timedelta(minutes=15)

    def test_matches_before_the_task_existed_are_not_missed(self):
        trigger = CronTrigger(CronExpression.parse("0 0 * * * *"), UTC)
        state = TriggerState(anchor=T0 + timedelta(minutes=30))
        assert trigger.next_fire_time(now=T0 + timedelta(minutes=30), state=state) == T0 + s(3600)

    def test_missed_daily_run_is_coalesced_after_an_outage(self):
        trigger = CronTrigger(CronExpression.parse("0 0 3 * * *"), UTC)
        last = datetime(2026, 3, 1, 3, tzinfo=UTC)
        now = datetime(2026, 3, 4, 10, tzinfo=UTC)
        state = TriggerState(anchor=last, last_fire_time=last)
        assert trigger.next_fire_time(now=now, state=state) == datetime(2026, 3, 4, 3, tzinfo=UTC)
        skip = CronTrigger(CronExpression.parse("0 0 3 * * *"), UTC, MissedRuns.SKIP)
        assert skip.next_fire_time(now=now, state=state) == datetime(2026, 3, 5, 3, tzinfo=UTC)
        run_all = CronTrigger(CronExpression.parse("0 0 3 * * *"), UTC, MissedRuns.RUN_ALL)
        assert run_all.next_fire_time(now=now, state=state) == datetime(2026, 3, 2, 3, tzinfo=UTC)

    def test_wall_clock_of_the_zone_berlin_across_spring_forward(self):
        # 2026-03-29: Berlin goes from 02:00 CET to 03:00 CEST. 09:00 local is 08:00 UTC
        # the day before and 07:00 UTC that day.
        trigger = CronTrigger(CronExpression.parse("0 0 9 * * *"), BERLIN)
        before = datetime(2026, 3, 28, 8, 0, tzinfo=UTC)
        state = TriggerState(anchor=before - s(1), last_fire_time=before)
        assert trigger.next_fire_time(now=before, state=state) == datetime(
            2026, 3, 29, 7, 0, tzinfo=UTC
        )

    def test_time_in_the_gap_is_skipped_that_day(self):
        # 02:30 does not exist in Berlin on 2026-03-29; the next is 02:30 CEST on 03-30.
        trigger = CronTrigger(CronExpression.parse("0 30 2 * * *"), BERLIN)
        last = datetime(2026, 3, 28, 1, 30, tzinfo=UTC)  # 02:30 CET on the 28th
        state = TriggerState(anchor=last, last_fire_time=last)
        assert trigger.next_fire_time(now=last, state=state) == datetime(
            2026, 3, 30, 0, 30, tzinfo=UTC
        )

    def test_time_in_the_overlap_fires_once_per_offset_new_york(self):
        # 2026-11-01: New York falls back from 02:00 EDT to 01:00 EST; 01:30 happens twice,
        # at 05:30 UTC (EDT) and at 06:30 UTC (EST).
        trigger = CronTrigger(CronExpression.parse("0 30 1 * * *"), NEW_YORK)
        last = datetime(2026, 10, 31, 5, 30, tzinfo=UTC)
        state = TriggerState(anchor=last, last_fire_time=last)
        first = trigger.next_fire_time(now=last, state=state)
        assert first == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)
        state = TriggerState(anchor=last, last_fire_time=first)
        assert trigger.next_fire_time(now=first, state=state) == datetime(
            2026, 11, 1, 6, 30, tzinfo=UTC
        )

    def test_a_month_long_outage_of_a_dense_cron_coalesces_to_the_newest_match(self):
        trigger = CronTrigger(CronExpression.parse("*/7 * * * * *"), BERLIN)
        last = datetime(2026, 3, 1, 3, tzinfo=UTC)
        now = datetime(2026, 4, 1, 10, 0, 30, 500000, tzinfo=UTC)
        state = TriggerState(anchor=last, last_fire_time=last)
        # Seconds 0, 7, ..., 28 match; the newest at or before 10:00:30.5 is 10:00:28.
        assert trigger.next_fire_time(now=now, state=state) == now.replace(second=28, microsecond=0)

    def test_coalescing_a_sparse_cron_finds_the_newest_match_far_back(self):
        trigger = CronTrigger(CronExpression.parse("0 0 3 1 1 *"), UTC)  # 1 January, 03:00
        last = datetime(2020, 1, 1, 3, tzinfo=UTC)
        now = datetime(2026, 7, 1, tzinfo=UTC)
        state = TriggerState(anchor=last, last_fire_time=last)
        assert trigger.next_fire_time(now=now, state=state) == datetime(2026, 1, 1, 3, tzinfo=UTC)

    def test_cron_fire_times_within_the_threshold_are_not_skipped(self):
        trigger = CronTrigger(CronExpression.parse("* * * * * *"), UTC)
        state = TriggerState(anchor=T0, last_fire_time=T0)
        assert trigger.next_fire_time(now=T0 + s(2.5), state=state) == T0 + s(1)

    def test_describe_names_the_zone(self):
        trigger = CronTrigger(CronExpression.parse("0 0 3 * * *"), BERLIN)
        assert trigger.describe() == "cron 0 0 3 * * * Europe/Berlin"


class TestOneShot:
    def test_fires_once(self):
        trigger = OneShotTrigger(T0 + s(60))
        assert trigger.next_fire_time(now=T0, state=TriggerState()) == T0 + s(60)
        state = TriggerState(last_fire_time=T0 + s(60))
        assert trigger.next_fire_time(now=T0 + s(61), state=state) is None

    def test_a_passed_time_fires_at_once_if_it_never_ran(self):
        trigger = OneShotTrigger(T0 - s(60))
        assert trigger.next_fire_time(now=T0, state=TriggerState()) == T0 - s(60)

    def test_needs_an_aware_time(self):
        with pytest.raises(ValueError, match="must be an aware datetime"):
            OneShotTrigger(datetime(2026, 1, 1))


class TestTriggerState:
    def test_is_a_frozen_value(self):
        state = TriggerState(anchor=T0, last_fire_time=T0 + s(10))
        with pytest.raises(dataclasses.FrozenInstanceError):
            state.anchor = T0  # type: ignore[misc]
        assert dataclasses.replace(state, last_finished=T0 + s(11)) == TriggerState(
            T0, T0 + s(10), T0 + s(11)
        )
        assert pickle.loads(pickle.dumps(state)) == state


class TestKeptState:
    """What a task keeps of its state: only what its trigger reads, shared with the tasks in
    the same state (after a burst, thousands of tasks keep one object)."""

    def test_a_trigger_that_does_not_count_from_the_end_of_a_run_keeps_no_end(self):
        ended = TriggerState(T0, T0 + s(10), T0 + s(11))
        for trigger in (
            CronTrigger(CronExpression("0 * * * * *"), UTC),
            FixedRateTrigger(s(10)),
            OneShotTrigger(T0),
        ):
            kept = kept_state(trigger, ended)
            assert kept == TriggerState(T0, T0 + s(10))
            # ...and says the same: the end never changed its answer.
            for now in (T0 + s(11), T0 + s(75)):
                assert trigger.next_fire_time(now=now, state=kept) == trigger.next_fire_time(
                    now=now, state=ended
                )

    def test_fixed_delay_keeps_the_end_it_counts_from(self):
        ended = TriggerState(T0, T0 + s(10), T0 + s(11))
        assert kept_state(FixedDelayTrigger(s(5)), ended) == ended

    def test_a_trigger_that_does_not_say_keeps_everything(self):
        class Custom:
            kind = "custom"

        ended = TriggerState(T0, T0 + s(10), T0 + s(11))
        assert kept_state(Custom(), ended) == ended  # type: ignore[arg-type]


class TestMakeTrigger:
    def test_builds_each_kind(self):
        assert isinstance(make_trigger(cron="0 0 3 * * *"), CronTrigger)
        assert make_trigger(fixed_rate="30s", initial_delay="1m") == FixedRateTrigger(s(30), s(60))
        assert make_trigger(fixed_delay=5) == FixedDelayTrigger(s(5))
        assert make_trigger(at=T0) == OneShotTrigger(T0)

    def test_cron_uses_the_default_zone_unless_given(self):
        assert make_trigger(cron="@daily", default_zone=BERLIN).zone is BERLIN
        assert make_trigger(cron="@daily", zone="America/New_York", default_zone=BERLIN).zone == (
            NEW_YORK
        )

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({}, "give exactly one of cron=, fixed_rate=, fixed_delay= or at=, got none"),
            (
                {"cron": "@daily", "fixed_rate": 5},
                "give exactly one of cron=, fixed_rate=, fixed_delay= or at=, got cron=, "
                "fixed_rate=",
            ),
            (
                {"cron": "@daily", "initial_delay": "5s"},
                "initial_delay= applies to fixed_rate= and fixed_delay= only, not to cron=",
            ),
            ({"fixed_rate": 5, "zone": "UTC"}, "zone= applies to cron= only, not to fixed_rate="),
            ({"fixed_rate": "0s"}, "fixed_rate must be positive, got '0s'"),
            ({"fixed_delay": -1}, "fixed_delay must be positive, got -1"),
            ({"fixed_rate": "fast"}, "invalid fixed_rate 'fast'"),
            ({"fixed_rate": 5, "initial_delay": "x"}, "invalid initial_delay 'x'"),
            ({"cron": "@daily", "zone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
            ({"fixed_rate": 5, "missed": "later"}, "missed='later' is not a policy"),
            ({"fixed_delay": 5, "missed": "skip"}, "missed= applies to cron= and fixed_rate= only"),
        ],
    )
    def test_rejections_name_the_value(self, options, message):
        with pytest.raises(ValueError) as info:
            make_trigger(**options)
        assert message in str(info.value)

    def test_identical_arguments_give_one_trigger(self):
        cron = make_trigger(cron="*/5 * * * * *", zone="Europe/Berlin", missed="skip")
        assert make_trigger(cron="*/5 * * * * *", zone="Europe/Berlin", missed="skip") is cron
        assert cron.describe() is cron.describe()
        rate = make_trigger(fixed_rate="30s", initial_delay=5, misfire_threshold=s(7))
        assert make_trigger(fixed_rate="30s", initial_delay=5, misfire_threshold=s(7)) is rate
        assert make_trigger(fixed_delay=s(5), default_zone=BERLIN) is make_trigger(
            fixed_delay=s(5), default_zone=BERLIN
        )

    def test_different_arguments_give_different_triggers(self):
        base = make_trigger(cron="0 0 9 * * *", default_zone=BERLIN)
        others = {
            "zone": make_trigger(cron="0 0 9 * * *", default_zone=NEW_YORK),
            "threshold": make_trigger(
                cron="0 0 9 * * *", default_zone=BERLIN, misfire_threshold=s(6)
            ),
            "missed": make_trigger(cron="0 0 9 * * *", default_zone=BERLIN, missed="skip"),
            "text": make_trigger(cron="0 0 9 ? * *", default_zone=BERLIN),
        }
        for what, other in others.items():
            assert other is not base, what
        assert others["zone"].zone is NEW_YORK
        assert others["threshold"].misfire_threshold == s(6)
        assert others["missed"].missed is MissedRuns.SKIP
        assert others["text"].describe() == "cron 0 0 9 ? * * Europe/Berlin"

    def test_arguments_equal_but_told_apart_give_their_own_trigger(self):
        # Fixed offsets compare by offset alone, equal instants across zones compare equal,
        # and True == 1: none of them may be served a trigger built from the other.
        zulu = timezone(timedelta(0), "Z")
        assert make_trigger(cron="@daily", default_zone=UTC).describe() == "cron @daily UTC"
        assert make_trigger(cron="@daily", default_zone=zulu).describe() == "cron @daily Z"
        berlin_noon = datetime(2026, 3, 1, 13, 0, tzinfo=BERLIN)
        assert make_trigger(at=T0).describe() == "once at 2026-03-01T12:00:00+00:00"
        assert make_trigger(at=berlin_noon).describe() == "once at 2026-03-01T13:00:00+01:00"
        assert make_trigger(fixed_rate=1) == FixedRateTrigger(s(1))
        with pytest.raises(ValueError, match="invalid fixed_rate True"):
            make_trigger(fixed_rate=True)

    def test_a_copy_describes_itself(self):
        trigger = make_trigger(cron="0 0 9 * * *", default_zone=BERLIN)
        assert trigger.describe() == "cron 0 0 9 * * * Europe/Berlin"
        moved = dataclasses.replace(trigger, zone=NEW_YORK)
        assert moved.describe() == "cron 0 0 9 * * * America/New_York"
        copy = pickle.loads(pickle.dumps(trigger))
        assert copy == trigger
        assert copy.describe() == "cron 0 0 9 * * * Europe/Berlin"
        rate = make_trigger(fixed_rate="1m")
        assert rate.describe() == "every 1m"
        assert dataclasses.replace(rate, period=s(30)).describe() == "every 30s"

    def test_invalid_cron_is_a_value_error(self):
        with pytest.raises(InvalidCronExpression, match="hour value 25 is out of range 0-23"):
            make_trigger(cron="0 0 25 * * *")
