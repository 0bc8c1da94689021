from datetime import timedelta

import pytest

from django_scheduling.schedules.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (30, timedelta(seconds=30)),
        (0.5, timedelta(milliseconds=500)),
        (timedelta(minutes=2), timedelta(minutes=2)),
        ("500ms", timedelta(milliseconds=500)),
        ("30s", timedelta(seconds=30)),
        ("10m", timedelta(minutes=10)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(minutes=90)),
        ("1.5s", timedelta(milliseconds=1500)),
        (" 10 M ", timedelta(minutes=10)),
        ("PT10M", timedelta(minutes=10)),
        ("pt0.5s", timedelta(milliseconds=500)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("P2D", timedelta(days=2)),
        ("PT1H2M3S", timedelta(hours=1, minutes=2, seconds=3)),
        (0, timedelta(0)),
        ("0s", timedelta(0)),
    ],
)
def test_accepted_forms(value, expected):
    assert parse_duration(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10 minutes", "invalid duration '10 minutes'"),
        ("", "invalid duration '': it is empty"),
        ("5", "invalid duration '5'"),
        ("1y", "invalid duration '1y'"),
        ("1m1m", "the unit 'm' appears twice"),
        ("P1M", "years and months are not fixed lengths"),
        ("PT", "an ISO-8601 duration looks like"),
        ("P", "an ISO-8601 duration looks like"),
        (True, "invalid duration True"),
        (None, "invalid duration None of type NoneType"),
        ([1], "of type list"),
        (float("nan"), "finite number of seconds"),
        (-1, "duration must not be negative, got -1"),
        ("-PT1S", "duration must not be negative, got '-PT1S'"),
        (timedelta(seconds=-3), "must not be negative"),
        ("-3s", "duration must not be negative, got '-3s'"),
        ("-1h30m", "duration must not be negative, got '-1h30m'"),
        ("--3s", "invalid duration '--3s'"),
        ("3-s", "invalid duration '3-s'"),
    ],
)
def test_rejected_forms_name_the_value(value, message):
    with pytest.raises(ValueError, match=None) as info:
        parse_duration(value)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("value", "shown"), [("0s", "'0s'"), (0, "0"), ("-3s", "'-3s'"), (-1, "-1")]
)
def test_zero_and_negative_rejected_where_only_positive_makes_sense(value, shown):
    with pytest.raises(ValueError) as info:
        parse_duration(value, name="fixed_delay", allow_zero=False)
    assert str(info.value) == f"fixed_delay must be positive, got {shown}"


def test_the_name_appears_in_the_message():
    with pytest.raises(ValueError, match=r"invalid lock_at_most_for 'soon'"):
        parse_duration("soon", name="lock_at_most_for")


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(seconds=30), "30s"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(days=1, seconds=1), "1d1s"),
    ],
)
def test_format_round_trips(delta, text):
    assert format_duration(delta) == text
    assert parse_duration(text) == delta


def test_a_bad_value_names_each_option_it_is_given_to():
    for name in ("fixed_rate", "jitter", "fixed_rate"):
        with pytest.raises(ValueError) as info:
            parse_duration("soon", name=name)
        assert str(info.value).startswith(f"invalid {name} 'soon'")
    assert parse_duration(1, name="jitter") == timedelta(seconds=1)
    with pytest.raises(ValueError, match="invalid jitter True"):
        parse_duration(True, name="jitter")  # equal to 1, but not a duration
