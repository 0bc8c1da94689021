"""
Tests for django_scheduling.schedules.cron.

Every expected time below was worked out by hand from a calendar and the zone's published
transitions (noted next to each test), not produced by running the code under test.
"""

from __future__ import annotations

import pickle
import time
from datetime import UTC, date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from django_scheduling.schedules.cron import CronExpression, InvalidCronExpression

from .cron_chain import chain

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
SAO_PAULO = ZoneInfo("America/Sao_Paulo")
CAIRO = ZoneInfo("Africa/Cairo")


def naive(*values: str) -> list[datetime]:
    return [datetime.fromisoformat(value) for value in values]


def assert_zoned_chain(expression: str, start: datetime, *expected: str) -> None:
    """Check instants, wall clock readings, offsets and tzinfo of a chain in start's zone."""
    results = chain(expression, start, len(expected))
    wanted = [datetime.fromisoformat(value) for value in expected]
    assert len(results) == len(wanted)
    for result, want in zip(results, wanted, strict=True):
        assert result is not None
        # Compare in UTC: == between zones is always False for times in a fold (PEP 495).
        assert result.astimezone(UTC) == want.astimezone(UTC)
        assert result.tzinfo is start.tzinfo
        assert result.replace(tzinfo=None) == want.replace(tzinfo=None)
        assert result.utcoffset() == want.utcoffset()


# --- The object itself ------------------------------------------------------------------------


def test_str_repr_and_expression_keep_the_original_text() -> None:
    cron = CronExpression.parse("  @Daily ")
    assert str(cron) == "  @Daily "
    assert cron.expression == "  @Daily "
    assert repr(cron) == "CronExpression('  @Daily ')"


def test_constructor_is_parse() -> None:
    assert CronExpression("0 0 * * * *") == CronExpression.parse("0 0 * * * *")


def test_equality_and_hash_use_the_normalized_fields() -> None:
    pairs = [
        ("0 0 9 ? * MON-FRI", "0 0 9 * * 1-5"),
        ("0 */15 9-17 * * *", "0 0,15,30,45 9,10,11,12,13,14,15,16,17 * * *"),
        ("*/15 9-17 * * *", "0 */15 9-17 * * *"),  # Five fields: seconds are 0.
        ("0 0 0 * * SUN", "0 0 0 * * 7"),
        ("0 0 0 1-31 * *", "0 0 0 * * ?"),
        ("0 0 0 L,1-31 * *", "0 0 0 * * *"),  # L adds nothing to every day.
        ("@weekly", "0 0 * * 0"),
    ]
    for first, second in pairs:
        assert CronExpression(first) == CronExpression(second), (first, second)
        assert hash(CronExpression(first)) == hash(CronExpression(second))
    assert CronExpression("0 0 0 * * MON") != CronExpression("0 0 0 * * TUE")
    assert CronExpression("0 0 0 L * *") != CronExpression("0 0 0 LW * *")
    assert CronExpression("0 0 * * * *") != "0 0 * * * *"
    assert len({CronExpression("@hourly"), CronExpression("0 0 * * * *")}) == 1


def test_pickle_round_trip() -> None:
    cron = CronExpression("0 15 10 ? * 6#3")
    copy = pickle.loads(pickle.dumps(cron))
    assert copy == cron
    assert str(copy) == "0 15 10 ? * 6#3"


def test_parse_returns_one_instance_per_text() -> None:
    first = CronExpression.parse("*/5 * * * * *")
    assert CronExpression.parse("*/5 * * * * *") is first
    # An equal schedule written otherwise is another instance, with its own text.
    other = CronExpression.parse("0/5 * * * * *")
    assert other == first
    assert other is not first
    assert str(other) == "0/5 * * * * *"
    # The constructor builds a new instance every time.
    assert CronExpression("*/5 * * * * *") is not first


def test_parse_rejects_an_invalid_text_every_time() -> None:
    for _ in range(2):
        with pytest.raises(InvalidCronExpression, match="second value 61 is out of range"):
            CronExpression.parse("61 * * * * *")


def test_parse_of_a_subclass_returns_the_subclass() -> None:
    class Custom(CronExpression):
        __slots__ = ()

    custom = Custom.parse("0 * * * * *")
    assert type(custom) is Custom
    assert type(CronExpression.parse("0 * * * * *")) is CronExpression


def test_invalid_cron_expression_is_a_value_error() -> None:
    assert issubclass(InvalidCronExpression, ValueError)


def test_non_string_expression_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="a cron expression must be a str, not NoneType"):
        CronExpression(None)  # type: ignore[arg-type]


def test_next_needs_a_datetime() -> None:
    with pytest.raises(TypeError, match="after must be a datetime, not date"):
        CronExpression("@daily").next(date(2024, 1, 1))  # type: ignore[arg-type]


# --- Rejections: one test per path, asserting the message ---------------------------------

FIELDS = (
    "6 fields 'second minute hour day-of-month month day-of-week' "
    "or 5 fields 'minute hour day-of-month month day-of-week'"
)
REJECTIONS = [
    ("", f"the expression is empty; expected {FIELDS}"),
    ("   ", f"the expression is empty; expected {FIELDS}"),
    ("*", f"expected {FIELDS}, found 1"),
    ("* * * *", f"expected {FIELDS}, found 4"),
    ("0 0 12 * * ? 2024", f"expected {FIELDS}, found 7; a year field is not supported"),
    (
        "@fortnightly",
        "unknown macro '@fortnightly'; use one of @yearly, @annually, @monthly, "
        "@weekly, @daily, @midnight, @hourly",
    ),
    (
        "@hourly *",
        "unknown macro '@hourly *'; use one of @yearly, @annually, @monthly, "
        "@weekly, @daily, @midnight, @hourly",
    ),
    ("0 0 25 * * *", "hour value 25 is out of range 0-23"),
    ("60 * * * * *", "second value 60 is out of range 0-59"),
    ("* 60 * * * *", "minute value 60 is out of range 0-59"),
    ("0 0 0 0 * *", "day-of-month value 0 is out of range 1-31"),
    ("0 0 0 32 * *", "day-of-month value 32 is out of range 1-31"),
    ("0 0 0 1 0 *", "month value 0 is out of range 1-12"),
    ("0 0 0 1 13 *", "month value 13 is out of range 1-12"),
    ("0 0 0 * * 8", "day-of-week value 8 is out of range 0-7"),
    ("0 25 * * *", "hour value 25 is out of range 0-23"),  # Five fields name the same fields.
    (
        "20-10 * * * * *",
        "second range '20-10' is reversed (20 > 10); write the smaller value "
        "first, ranges do not wrap around",
    ),
    (
        "0 0 0 * * FRI-MON",
        "day-of-week range 'FRI-MON' is reversed (5 > 1); write the smaller "
        "value first, ranges do not wrap around",
    ),
    ("*/0 * * * * *", "second step 0 in '*/0' must be 1 or higher"),
    ("0 0-30/0 * * * *", "minute step 0 in '0-30/0' must be 1 or higher"),
    ("0 */x * * * *", "minute step 'x' in '*/x' is not a number"),
    ("0 5/ * * * *", "minute step '' in '5/' is not a number"),
    ("? * * * * *", "second does not accept '?'; use '*'"),
    ("0 ? * * * *", "minute does not accept '?'; use '*'"),
    ("0 0 ? * * *", "hour does not accept '?'; use '*'"),
    ("0 0 0 * ? *", "month does not accept '?'; use '*'"),
    ("0 0 0 1,? * *", "day-of-month '?' must stand alone, not in a list like '1,?'"),
    ("0 0 0 ? * MON,?", "day-of-week '?' must stand alone, not in a list like 'MON,?'"),
    ("1,,2 * * * * *", "second has an empty list element in '1,,2'"),
    ("0 0 1, * * *", "hour has an empty list element in '1,'"),
    ("x * * * * *", "second value 'x' is not a number"),
    ("0 0 *ANYTHING * * *", "hour value '*ANYTHING' is not a number"),
    ("0 0 1-2-3 * * *", "hour value '2-3' is not a number"),
    ("0 0 -5 * * *", "hour element '-5' is missing a value"),
    ("0 0 0 1 FOO *", "month value 'FOO' is not a number 1-12 or a name JAN-DEC"),
    ("0 0 0 1 MON *", "month value 'MON' is not a number 1-12 or a name JAN-DEC"),
    ("0 0 0 * * SUN*", "day-of-week value 'SUN*' is not a number 0-7 or a name MON-SUN"),
    ("0 0 0 * * JAN", "day-of-week value 'JAN' is not a number 0-7 or a name MON-SUN"),
    ("0 0 * * JAN", "day-of-week value 'JAN' is not a number 0-7 or a name SUN-SAT"),
    (
        "0 0 * * 7-5",
        "day-of-week range '7-5' is reversed (7 > 5); write the smaller value first, "
        "ranges do not wrap around",
    ),
    ("0 0 * * 1,?", "day-of-week '?' must stand alone, not in a list like '1,?'"),
    ("0 0 * * 8#1", "day-of-week value 8 is out of range 0-7"),
    ("0 0 0 W * *", "day-of-month 'W' needs a day before it, e.g. '15W'"),
    ("0 0 0 0W * *", "day-of-month value 0 is out of range 1-31"),
    ("0 0 0 32W * *", "day-of-month value 32 is out of range 1-31"),
    (
        "0 0 0 1-5W * *",
        "day-of-month value '1-5W' is not valid; 'W' follows a single day of the month, e.g. '15W'",
    ),
    (
        "0 0 0 WW * *",
        "day-of-month value 'WW' is not valid; 'W' follows a single day of the month, e.g. '15W'",
    ),
    (
        "0 0 0 W1 * *",
        "day-of-month value 'W1' is not valid; use 'L', 'L-3', 'LW' or a day "
        "followed by 'W' such as '15W'",
    ),
    (
        "0 0 0 1L * *",
        "day-of-month value '1L' is not valid; use 'L', 'L-3', 'LW' or a day "
        "followed by 'W' such as '15W'",
    ),
    (
        "0 0 0 LL * *",
        "day-of-month value 'LL' is not valid; use 'L', 'L-3', 'LW' or a day "
        "followed by 'W' such as '15W'",
    ),
    ("0 0 0 L-0 * *", "day-of-month offset in 'L-0' must be 1 or more; use 'L'"),
    ("0 0 0 lw * *", "day-of-month value 'lw' is not a number; write 'L' and 'W' in upper case"),
    (
        "0 0 0 ? * L",
        "day-of-week 'L' needs a day before it, e.g. '5L' or 'FRIL' for the last "
        "Friday; for the last day of the month use 'L' in day-of-month",
    ),
    (
        "0 0 0 ? * L1",
        "day-of-week value 'L1' is not valid; 'L' follows a single day, e.g. '5L' or 'FRIL'",
    ),
    (
        "0 0 0 ? * LL",
        "day-of-week value 'LL' is not valid; 'L' follows a single day, e.g. '5L' or 'FRIL'",
    ),
    ("0 0 0 ? * 8L", "day-of-week value 8 is out of range 0-7"),
    ("0 0 0 ? * -4L", "day-of-week value '-4' is not a number 0-7 or a name MON-SUN"),
    ("0 0 0 ? * #", "day-of-week value '#' needs a day before '#', e.g. 'FRI#2'"),
    ("0 0 0 ? * #1", "day-of-week value '#1' needs a day before '#', e.g. 'FRI#2'"),
    ("0 0 0 ? * 1#", "day-of-week value '1#' needs an ordinal after '#', e.g. 'FRI#2'"),
    ("0 0 0 ? * 1#L", "day-of-week ordinal 'L' in '1#L' is not a number"),
    ("0 0 0 ? * FRI#-1", "day-of-week ordinal '-1' in 'FRI#-1' is not a number"),
    ("0 0 0 ? * 8#1", "day-of-week value 8 is out of range 0-7"),
    ("0 0 0 ? * 5#0", "day-of-week ordinal in '5#0' must be 1 or more"),
]


@pytest.mark.parametrize("expression, problem", REJECTIONS, ids=[r[0] for r in REJECTIONS])
def test_rejection_message(expression: str, problem: str) -> None:
    with pytest.raises(InvalidCronExpression) as caught:
        CronExpression.parse(expression)
    assert str(caught.value) == f"invalid cron expression '{expression}': {problem}"


# --- Fields, names, steps ---------------------------------------------------------------------


def test_strictly_after_and_microseconds() -> None:
    assert chain("* * * * * *", datetime(2024, 1, 1, 12, 0, 0), 1) == naive("2024-01-01T12:00:01")
    assert chain("* * * * * *", datetime(2024, 1, 1, 12, 0, 0, 999_999), 1) == naive(
        "2024-01-01T12:00:01"
    )
    # Exactly at a fire time: the next one, a day later.
    assert chain("0 0 12 * * *", datetime(2024, 1, 1, 12), 1) == naive("2024-01-02T12:00")


def test_step_from_a_start_value_runs_to_the_end_of_the_range() -> None:
    # 5/15 is 5, 20, 35, 50.
    assert chain("5/15 * * * * *", datetime(2024, 1, 1, 12), 5) == naive(
        "2024-01-01T12:00:05",
        "2024-01-01T12:00:20",
        "2024-01-01T12:00:35",
        "2024-01-01T12:00:50",
        "2024-01-01T12:01:05",
    )


def test_stepped_range_and_stepped_wildcard() -> None:
    # Minutes 10-40/15 are 10, 25, 40.
    assert chain("0 10-40/15 * * * *", datetime(2024, 1, 1, 12), 4) == naive(
        "2024-01-01T12:10", "2024-01-01T12:25", "2024-01-01T12:40", "2024-01-01T13:10"
    )
    # Hours */7 are 0, 7, 14, 21.
    assert chain("0 0 */7 * * *", datetime(2024, 1, 1, 1), 4) == naive(
        "2024-01-01T07:00", "2024-01-01T14:00", "2024-01-01T21:00", "2024-01-02T00:00"
    )
    # Months */4 are 1, 5, 9.
    assert chain("0 0 0 1 */4 *", datetime(2024, 2, 1), 3) == naive(
        "2024-05-01T00:00", "2024-09-01T00:00", "2025-01-01T00:00"
    )


def test_day_of_week_step_counts_monday_first() -> None:
    # */2 over 1-7 is Mon, Wed, Fri, Sun. 2024-01-02 is a Tuesday.
    assert chain("0 0 0 * * */2", datetime(2024, 1, 2, 12), 4) == naive(
        "2024-01-03T00:00", "2024-01-05T00:00", "2024-01-07T00:00", "2024-01-08T00:00"
    )
    # 0/2 runs over 0-7 from Sunday: Sun, Tue, Thu, Sat. 2024-01-01 is a Monday.
    assert chain("0 0 0 * * 0/2", datetime(2024, 1, 1, 12), 4) == naive(
        "2024-01-02T00:00", "2024-01-04T00:00", "2024-01-06T00:00", "2024-01-07T00:00"
    )


def test_zero_and_seven_are_sunday() -> None:
    # 2024-01-01 is a Monday; the next Sunday is the 7th.
    for field in ("0", "7", "SUN", "sun"):
        assert chain(f"0 0 0 * * {field}", datetime(2024, 1, 1), 2) == naive(
            "2024-01-07T00:00", "2024-01-14T00:00"
        )


def test_sunday_starting_a_range_means_zero() -> None:
    # 7-5 is 0-5, Sunday to Friday: from Friday 2024-01-05 the Saturday is skipped.
    assert chain("0 0 0 * * 7-5", datetime(2024, 1, 5, 12), 2) == naive(
        "2024-01-07T00:00", "2024-01-08T00:00"
    )
    # SUN-TUE is 7-2, so 0-2: from Wednesday 2024-01-03 the next is Sunday the 7th.
    assert chain("0 0 12 ? * SUN-TUE", datetime(2024, 1, 3), 2) == naive(
        "2024-01-07T12:00", "2024-01-08T12:00"
    )
    # Spring's rule taken literally: 7-7 becomes 0-7, which is every day.
    assert chain("0 0 0 * * 7-7", datetime(2024, 1, 1), 1) == naive("2024-01-02T00:00")


def test_names_are_case_insensitive() -> None:
    assert chain("0 0 0 1 jan,Jul ?", datetime(2024, 2, 1), 2) == naive(
        "2024-07-01T00:00", "2025-01-01T00:00"
    )
    # From Friday 2024-01-05 noon, the next weekday noon is Monday the 8th.
    assert chain("0 0 12 ? * mon-FRI", datetime(2024, 1, 5, 12), 1) == naive("2024-01-08T12:00")


def test_whitespace_between_fields() -> None:
    assert CronExpression("0\t0  12 * *\t*") == CronExpression("0 0 12 * * *")


def test_five_field_form_fires_at_second_zero() -> None:
    assert chain("*/20 9 * * *", datetime(2024, 1, 1, 9, 0, 30), 3) == naive(
        "2024-01-01T09:20", "2024-01-01T09:40", "2024-01-02T09:00"
    )
    # Day specials work too: the last day of February 2024 (a leap year) is the 29th.
    assert chain("0 0 L * ?", datetime(2024, 2, 1), 1) == naive("2024-02-29T00:00")


def test_day_fields_combine_with_and() -> None:
    # Friday the 13th. 2024: Jan 13 Sat, Feb 13 Tue, Mar 13 Wed, Apr 13 Sat, May 13 Mon,
    # Jun 13 Thu, Jul 13 Sat, Aug 13 Tue, Sep 13 Fri. (OR would give Friday 2024-01-05.)
    assert chain("0 0 0 13 * FRI", datetime(2024, 1, 1), 1) == naive("2024-09-13T00:00")
    # The last day of the month that is a Friday: Jan 31 Wed, Feb 29 Thu, Mar 31 Sun,
    # Apr 30 Tue, May 31 Fri.
    assert chain("0 0 0 L * FRI", datetime(2024, 1, 1), 1) == naive("2024-05-31T00:00")


# --- Five-field lines: cron's rules -------------------------------------------------------------


def test_five_field_day_fields_combine_with_or_when_both_are_restricted() -> None:
    # January 2024 starts on a Monday: its Fridays are the 5th, 12th, 19th and 26th.
    assert chain("0 0 13 * 5", datetime(2024, 1, 1), 4) == naive(
        "2024-01-05T00:00", "2024-01-12T00:00", "2024-01-13T00:00", "2024-01-19T00:00"
    )
    # Thursday to Saturday, or the 17th, in July. 2026-07-09 is a Thursday, 2026-07-10 a
    # Friday and 2026-07-17 a Friday too.
    assert chain("0,14,26 4,17,21 17 7 4-6", datetime(2026, 7, 9, 21, 26), 4) == naive(
        "2026-07-10T04:00", "2026-07-10T04:14", "2026-07-10T04:26", "2026-07-10T17:00"
    )
    # The same fields with a seconds field: Spring's AND, so the 17th when it is Thu-Sat.
    assert chain("0 0,14,26 4,17,21 17 7 4-6", datetime(2026, 7, 9, 21, 26), 1) == naive(
        "2026-07-17T04:00"
    )


def test_five_field_day_field_starting_with_a_star_means_and() -> None:
    # Odd days that are Mondays: January 2024 Mondays 1, 8, 15, 22, 29; February 5, 12, 19, 26.
    assert chain("0 0 */2 * 1", datetime(2024, 1, 1), 3) == naive(
        "2024-01-15T00:00", "2024-01-29T00:00", "2024-02-05T00:00"
    )
    # */7 is Sunday (0 and 7), and starts with "*": the 13th when it is a Sunday. In 2024 the
    # 13th falls on Sat, Tue, Wed, Sat, Mon, Thu, Sat, Tue, Fri, then Sunday in October.
    assert chain("0 0 13 * */7", datetime(2024, 1, 1), 1) == naive("2024-10-13T00:00")
    # "?" is "*": Fridays only.
    assert chain("0 0 ? * 5", datetime(2024, 1, 1), 2) == naive(
        "2024-01-05T00:00", "2024-01-12T00:00"
    )


def test_five_field_day_of_week_counts_from_sunday() -> None:
    # */2 over 0-7 is Sun, Tue, Thu, Sat. 2024-01-01 is a Monday.
    assert chain("0 0 * * */2", datetime(2024, 1, 1, 12), 4) == naive(
        "2024-01-02T00:00", "2024-01-04T00:00", "2024-01-06T00:00", "2024-01-07T00:00"
    )
    # */3 is Sun, Wed, Sat. 2026-12-27 is a Sunday, 2026-12-30 a Wednesday, 2027-01-02 a
    # Saturday. Spring's six-field */3 is Mon, Thu, Sun: Monday the 28th.
    assert chain("5,13,28 10 * * */3", datetime(2026, 12, 27, 10, 28), 4) == naive(
        "2026-12-30T10:05", "2026-12-30T10:13", "2026-12-30T10:28", "2027-01-02T10:05"
    )
    assert chain("0 5,13,28 10 * * */3", datetime(2026, 12, 27, 10, 28), 1) == naive(
        "2026-12-28T10:05"
    )
    # SUN is 0, so SUN/3 is 0, 3, 6 as well.
    assert CronExpression("0 0 * * SUN/3") == CronExpression("0 0 * * */3")


def test_five_field_sunday_in_ranges() -> None:
    # 7-7 is Sunday alone (Spring's six-field form reads it as 0-7, every day).
    assert chain("0 0 * * 7-7", datetime(2024, 1, 1), 2) == naive(
        "2024-01-07T00:00", "2024-01-14T00:00"
    )
    # A range ending on Sunday runs to 7, as in cronie: Friday, Saturday, Sunday.
    for field in ("FRI-SUN", "5-0", "5-7", "fri-sun"):
        assert chain(f"0 0 * * {field}", datetime(2024, 1, 1), 4) == naive(
            "2024-01-05T00:00", "2024-01-06T00:00", "2024-01-07T00:00", "2024-01-12T00:00"
        )
    # SUN-TUE is 0-2: from Wednesday 2024-01-03 the next is Sunday the 7th.
    assert chain("0 12 * * SUN-TUE", datetime(2024, 1, 3), 2) == naive(
        "2024-01-07T12:00", "2024-01-08T12:00"
    )


def test_five_field_quartz_tokens_combine_by_the_same_rule() -> None:
    # The last day of the month or a Friday: 2024-01-26 is a Friday, January 31 a Wednesday,
    # February 2 a Friday.
    assert chain("0 0 L * 5", datetime(2024, 1, 26, 12), 2) == naive(
        "2024-01-31T00:00", "2024-02-02T00:00"
    )
    # The weekday nearest the 15th, or the first Monday. Jan 2024: Monday the 1st, and the
    # 15th is a Monday; Feb 2024: the 1st is a Thursday (first Monday the 5th), the 15th a
    # Thursday.
    assert chain("0 0 15W * MON#1", datetime(2023, 12, 31), 4) == naive(
        "2024-01-01T00:00", "2024-01-15T00:00", "2024-02-05T00:00", "2024-02-15T00:00"
    )
    # With "*" in the other field, a token alone decides: the last Friday of the month.
    assert chain("0 0 * * 5L", datetime(2024, 2, 1), 2) == naive(
        "2024-02-23T00:00", "2024-03-29T00:00"
    )


def test_five_field_and_six_field_rules_differ() -> None:
    assert CronExpression("0 0 * * */2") != CronExpression("0 0 0 * * */2")
    assert CronExpression("0 0 * * */2") == CronExpression("0 0 0 * * 0,2,4,6")
    assert CronExpression("0 0 13 * 5") != CronExpression("0 0 0 13 * 5")
    # With OR, "1-31" or "0-7" in one day field means every day.
    assert CronExpression("0 0 1-31 * 1") == CronExpression("0 0 * * *")
    assert CronExpression("0 0 13 * 0-7") == CronExpression("@daily")
    # A star in either field keeps AND, and then both forms agree.
    assert CronExpression("0 0 13 * *") == CronExpression("0 0 0 13 * *")
    assert CronExpression("0 9 * * MON-FRI") == CronExpression("0 0 9 ? * MON-FRI")


@pytest.mark.parametrize(
    "macro, line",
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ],
)
def test_macros_mean_what_they_mean_in_cron(macro: str, line: str) -> None:
    # cronie's definitions. Each restricts at most one day field, so both rule sets agree.
    assert CronExpression(macro) == CronExpression(line)
    start = datetime(2024, 2, 28, 12, tzinfo=BERLIN)
    assert chain(macro, start, 5) == chain(line, start, 5)


def test_five_field_lines_follow_the_same_dst_rule() -> None:
    # Berlin 2021: 02:30 does not exist on March 28 and happens twice on October 31 (see the
    # six-field tests below). Debian's cron would run the first at 03:00 and the second once.
    assert_zoned_chain(
        "30 2 * * *", datetime(2021, 3, 27, 12, tzinfo=BERLIN), "2021-03-29T02:30+02:00"
    )
    assert_zoned_chain(
        "30 2 * * *",
        datetime(2021, 10, 30, 12, tzinfo=BERLIN),
        "2021-10-31T02:30+02:00",
        "2021-10-31T02:30+01:00",
        "2021-11-01T02:30+01:00",
    )


# --- Day-of-month specials ---------------------------------------------------------------------


def test_last_day_of_month() -> None:
    assert chain("0 0 0 L * *", datetime(2024, 1, 31), 3) == naive(
        "2024-02-29T00:00", "2024-03-31T00:00", "2024-04-30T00:00"
    )


def test_last_day_of_month_with_offset() -> None:
    # L-2: Feb 29 - 2, Mar 31 - 2, Apr 30 - 2.
    assert chain("0 0 0 L-2 * *", datetime(2024, 2, 1), 3) == naive(
        "2024-02-27T00:00", "2024-03-29T00:00", "2024-04-28T00:00"
    )


def test_last_weekday_of_month() -> None:
    # Sep 30 2024 is a Monday, Oct 31 a Thursday, Nov 30 a Saturday (so Friday the 29th).
    assert chain("0 0 0 LW * *", datetime(2024, 9, 1), 3) == naive(
        "2024-09-30T00:00", "2024-10-31T00:00", "2024-11-29T00:00"
    )
    # Mar 31 2024 is a Sunday: Friday the 29th.
    assert chain("0 0 0 LW * *", datetime(2024, 3, 1), 1) == naive("2024-03-29T00:00")


def test_nearest_weekday() -> None:
    # 15W: Feb 15 2024 is a Thursday; Jun 15 2024 a Saturday (Friday the 14th); Sep 15 2024
    # a Sunday (Monday the 16th).
    assert chain("0 0 0 15W * *", datetime(2024, 2, 1), 1) == naive("2024-02-15T00:00")
    assert chain("0 0 0 15W * *", datetime(2024, 6, 1), 1) == naive("2024-06-14T00:00")
    assert chain("0 0 0 15W * *", datetime(2024, 9, 1), 1) == naive("2024-09-16T00:00")


def test_nearest_weekday_never_leaves_the_month() -> None:
    # 1W: Jun 1 2024 is a Saturday, so Monday the 3rd, not Friday May 31; Sep 1 2024 is a
    # Sunday, so Monday the 2nd.
    assert chain("0 0 0 1W * *", datetime(2024, 5, 31, 12), 1) == naive("2024-06-03T00:00")
    assert chain("0 0 0 1W * *", datetime(2024, 8, 31), 1) == naive("2024-09-02T00:00")
    # 31W: Mar 31 2024 is a Sunday and Monday would be April, so March does not fire; April
    # has no 31st; May 31 2024 is a Friday.
    assert chain("0 0 0 31W * *", datetime(2024, 3, 1), 1) == naive("2024-05-31T00:00")
    # 30W: February has no 30th; Mar 30 2024 is a Saturday, so Friday the 29th.
    assert chain("0 0 0 30W * *", datetime(2024, 2, 1), 1) == naive("2024-03-29T00:00")


def test_day_of_month_list_with_specials() -> None:
    # 1W, 15 and LW in 2024-01: Jan 1 is a Monday, Jan 31 a Wednesday; Feb 1 a Thursday.
    assert chain("0 0 0 1W,15,LW * ?", datetime(2023, 12, 31), 4) == naive(
        "2024-01-01T00:00", "2024-01-15T00:00", "2024-01-31T00:00", "2024-02-01T00:00"
    )


# --- Day-of-week specials ----------------------------------------------------------------------


def test_last_weekday_of_the_month() -> None:
    # Fridays of Feb 2024: 2, 9, 16, 23; of Mar 2024: 1, 8, 15, 22, 29.
    for field in ("5L", "FRIL", "fril"):
        assert chain(f"0 0 0 ? * {field}", datetime(2024, 2, 1), 2) == naive(
            "2024-02-23T00:00", "2024-03-29T00:00"
        )
    # Last Sunday of March 2024 is the 31st, 0L and 7L alike.
    assert chain("0 0 0 ? * 0L", datetime(2024, 3, 1), 1) == naive("2024-03-31T00:00")
    assert chain("0 0 0 ? * 7L", datetime(2024, 3, 1), 1) == naive("2024-03-31T00:00")


def test_nth_weekday_of_the_month() -> None:
    # Mondays: Jan 2024 1, 8; Feb 2024 5, 12; Mar 2024 4, 11.
    assert chain("0 0 0 ? * MON#2", datetime(2024, 1, 1), 3) == naive(
        "2024-01-08T00:00", "2024-02-12T00:00", "2024-03-11T00:00"
    )


def test_fifth_weekday_only_in_months_that_have_one() -> None:
    # Thursdays: Jan 2024 4-25 (four); Feb 2024 1, 8, 15, 22, 29; Mar 7-28 and Apr 4-25
    # (four each); May 2024 2, 9, 16, 23, 30.
    assert chain("0 0 0 ? * 4#5", datetime(2024, 1, 1), 2) == naive(
        "2024-02-29T00:00", "2024-05-30T00:00"
    )


# --- Never, and the end of time ----------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 0 30 2 *",  # February never has a 30th.
        "0 0 0 31 4,6,9,11 ?",  # Nor do the 30-day months have a 31st.
        "0 0 0 30W 2 *",
        "0 0 0 L-31 * *",  # 31 days before the last day is never in the month.
        "0 0 0 ? * 1#6",  # No month has six Mondays.
        "0 0 30 2 *",  # The five-field form.
    ],
)
def test_never_fires(expression: str) -> None:
    started = time.perf_counter()
    assert CronExpression(expression).next(datetime(2024, 1, 1)) is None
    assert CronExpression(expression).next(datetime(2024, 1, 1, tzinfo=BERLIN)) is None
    assert time.perf_counter() - started < 1.0  # Bounded search, not a 400-year walk per call.


def test_rare_dates_are_found() -> None:
    # Feb 29 moves 5 weekdays every 4 years (1461 days = 208 weeks + 5): 2024 Thu, 2028 Tue,
    # 2032 Sun, 2036 Fri, 2040 Wed, 2044 Mon.
    assert chain("0 0 0 29 2 MON", datetime(2024, 3, 1), 1) == naive("2044-02-29T00:00")


def test_nothing_after_year_9999() -> None:
    assert chain("* * * * * *", datetime(9999, 12, 31, 23, 59, 58), 2) == [
        datetime(9999, 12, 31, 23, 59, 59),
        None,
    ]
    assert CronExpression("@yearly").next(datetime(9999, 6, 1)) is None
    assert CronExpression("@yearly").next(datetime.max) is None


# --- Time zones --------------------------------------------------------------------------------


def test_fixed_offset_zone_keeps_its_tzinfo() -> None:
    india = timezone(timedelta(hours=5, minutes=30))
    assert_zoned_chain(
        "0 30 9 * * *", datetime(2024, 1, 1, 10, tzinfo=india), "2024-01-02T09:30+05:30"
    )
    assert_zoned_chain("0 0 * * * *", datetime(2024, 1, 1, 10, tzinfo=UTC), "2024-01-01T11:00Z")


# Europe/Berlin 2021: 2021-03-28 02:00 CET (+01) jumps to 03:00 CEST (+02), at 01:00 UTC;
# 2021-10-31 03:00 CEST falls back to 02:00 CET, at 01:00 UTC, so 02:00-02:59 happens twice.


def test_berlin_fixed_time_in_the_gap_is_skipped_that_day() -> None:
    start = datetime(2021, 3, 27, 12, tzinfo=BERLIN)
    assert_zoned_chain("0 30 2 * * *", start, "2021-03-29T02:30+02:00")


def test_berlin_hourly_and_minutely_across_the_gap() -> None:
    # 01:00+01 is 00:00 UTC; one real hour later it is 03:00+02.
    assert_zoned_chain(
        "0 0 * * * *",
        datetime(2021, 3, 28, 1, tzinfo=BERLIN),
        "2021-03-28T03:00+02:00",
        "2021-03-28T04:00+02:00",
    )
    assert_zoned_chain(
        "0 * * * * *", datetime(2021, 3, 28, 1, 59, tzinfo=BERLIN), "2021-03-28T03:00+02:00"
    )
    # Minute 30 of hour 2 does not exist; the next is 03:30.
    assert_zoned_chain(
        "0 30 * * * *", datetime(2021, 3, 28, 1, 30, tzinfo=BERLIN), "2021-03-28T03:30+02:00"
    )
    # Hours 2 and 3: 02:00 does not exist, 03:00 does.
    assert_zoned_chain(
        "0 0 2,3 * * *", datetime(2021, 3, 28, 1, tzinfo=BERLIN), "2021-03-28T03:00+02:00"
    )


def test_berlin_start_inside_the_gap_is_read_as_the_instant_it_names() -> None:
    # 02:30 does not exist on 2021-03-28; with fold=0 it is read with +01:00, i.e. 01:30 UTC,
    # which is 03:30+02. The next full hour is 04:00+02.
    start = datetime(2021, 3, 28, 2, 30, tzinfo=BERLIN)
    assert_zoned_chain("0 0 * * * *", start, "2021-03-28T04:00+02:00")


def test_berlin_fixed_time_in_the_overlap_fires_once_per_offset() -> None:
    start = datetime(2021, 10, 30, 12, tzinfo=BERLIN)
    assert_zoned_chain(
        "0 30 2 * * *",
        start,
        "2021-10-31T02:30+02:00",  # 00:30 UTC
        "2021-10-31T02:30+01:00",  # 01:30 UTC
        "2021-11-01T02:30+01:00",
    )
    second = chain("0 30 2 * * *", start, 2)[1]
    assert second is not None and second.fold == 1


def test_berlin_hourly_and_minutely_across_the_overlap() -> None:
    assert_zoned_chain(
        "0 0 * * * *",
        datetime(2021, 10, 31, 0, 30, tzinfo=BERLIN),
        "2021-10-31T01:00+02:00",
        "2021-10-31T02:00+02:00",
        "2021-10-31T02:00+01:00",
        "2021-10-31T03:00+01:00",
    )
    # 02:59+02 is 00:59 UTC; one minute later is 01:00 UTC, 02:00+01.
    assert_zoned_chain(
        "0 * * * * *",
        datetime(2021, 10, 31, 2, 59, tzinfo=BERLIN),
        "2021-10-31T02:00+01:00",
        "2021-10-31T02:01+01:00",
    )
    assert_zoned_chain(
        "0 */20 2 * * *",
        datetime(2021, 10, 31, 1, 59, tzinfo=BERLIN),
        "2021-10-31T02:00+02:00",
        "2021-10-31T02:20+02:00",
        "2021-10-31T02:40+02:00",
        "2021-10-31T02:00+01:00",
        "2021-10-31T02:20+01:00",
        "2021-10-31T02:40+01:00",
        "2021-11-01T02:00+01:00",
    )


def test_berlin_start_in_the_overlap() -> None:
    # 02:45+02 (first pass, 00:45 UTC): 02:30 is behind on the wall clock but its second
    # pass, 02:30+01 (01:30 UTC), is still ahead.
    first_pass = datetime(2021, 10, 31, 2, 45, tzinfo=BERLIN)
    assert_zoned_chain("0 30 2 * * *", first_pass, "2021-10-31T02:30+01:00")
    assert_zoned_chain("0 15 * * * *", first_pass, "2021-10-31T02:15+01:00")
    # 02:45+01 (second pass, fold=1, 01:45 UTC): both 02:30s are over.
    second_pass = datetime(2021, 10, 31, 2, 45, tzinfo=BERLIN, fold=1)
    assert_zoned_chain("0 30 2 * * *", second_pass, "2021-11-01T02:30+01:00")
    assert_zoned_chain("0 15 * * * *", second_pass, "2021-10-31T03:15+01:00")


# America/New_York 2024: 2024-03-10 02:00 EST (-05) jumps to 03:00 EDT (-04); 2024-11-03
# 02:00 EDT falls back to 01:00 EST, so 01:00-01:59 happens twice.


def test_new_york_gap() -> None:
    start = datetime(2024, 3, 9, 12, tzinfo=NEW_YORK)
    assert_zoned_chain("0 30 2 * * *", start, "2024-03-11T02:30-04:00")
    assert_zoned_chain(
        "0 */30 * * * *",
        datetime(2024, 3, 10, 1, 15, tzinfo=NEW_YORK),
        "2024-03-10T01:30-05:00",
        "2024-03-10T03:00-04:00",
        "2024-03-10T03:30-04:00",
    )


def test_new_york_overlap() -> None:
    assert_zoned_chain(
        "0 30 1 * * *",
        datetime(2024, 11, 2, 12, tzinfo=NEW_YORK),
        "2024-11-03T01:30-04:00",
        "2024-11-03T01:30-05:00",
        "2024-11-04T01:30-05:00",
    )
    assert_zoned_chain(
        "0 0 * * * *",
        datetime(2024, 11, 3, 0, 30, tzinfo=NEW_YORK),
        "2024-11-03T01:00-04:00",
        "2024-11-03T01:00-05:00",
        "2024-11-03T02:00-05:00",
    )


# America/Sao_Paulo: 2018-11-04 00:00 (-03) jumped to 01:00 (-02), at 03:00 UTC, so that
# midnight did not exist; 2019-02-17 00:00 (-02) fell back to 2019-02-16 23:00 (-03), at
# 02:00 UTC, so 23:00-23:59 on the 16th happened twice.


def test_sao_paulo_midnight_gap() -> None:
    start = datetime(2018, 11, 3, 12, tzinfo=SAO_PAULO)
    assert_zoned_chain("0 0 0 * * *", start, "2018-11-05T00:00-02:00")
    assert_zoned_chain("0 30 0 * * *", start, "2018-11-05T00:30-02:00")
    # 2018-11-04 was a Sunday: a weekly Sunday-midnight job skips to the next Sunday.
    assert_zoned_chain("0 0 0 ? * SUN", start, "2018-11-11T00:00-02:00")
    # 23:00-03 is 02:00 UTC; one real hour later is 01:00-02.
    assert_zoned_chain(
        "0 0 * * * *", datetime(2018, 11, 3, 23, tzinfo=SAO_PAULO), "2018-11-04T01:00-02:00"
    )
    assert_zoned_chain(
        "0 * * * * *",
        datetime(2018, 11, 3, 23, 59, tzinfo=SAO_PAULO),
        "2018-11-04T01:00-02:00",
    )
    assert_zoned_chain(
        "0 30 * * * *",
        datetime(2018, 11, 3, 23, 30, tzinfo=SAO_PAULO),
        "2018-11-04T01:30-02:00",
    )


def test_sao_paulo_overlap_before_midnight() -> None:
    assert_zoned_chain(
        "0 30 23 * * *",
        datetime(2019, 2, 16, 12, tzinfo=SAO_PAULO),
        "2019-02-16T23:30-02:00",
        "2019-02-16T23:30-03:00",
        "2019-02-17T23:30-03:00",
    )
    # Midnight itself happens once.
    assert_zoned_chain(
        "0 0 0 * * *",
        datetime(2019, 2, 16, 23, 30, tzinfo=SAO_PAULO),
        "2019-02-17T00:00-03:00",
        "2019-02-18T00:00-03:00",
    )
    assert_zoned_chain(
        "0 0 * * * *",
        datetime(2019, 2, 16, 22, 30, tzinfo=SAO_PAULO),
        "2019-02-16T23:00-02:00",
        "2019-02-16T23:00-03:00",
        "2019-02-17T00:00-03:00",
    )


# Africa/Cairo 2024: 2024-04-26 (last Friday of April) 00:00 EET (+02) jumped to 01:00 EEST
# (+03); 2024-10-31 (last Thursday of October) 24:00 EEST fell back to 23:00 EET, so 23:00-23:59
# on the 31st happened twice.


def test_cairo_midnight_gap() -> None:
    # Every two hours: 00:00 does not exist, 01:00 does not match, 02:00 is next.
    assert_zoned_chain(
        "0 0 */2 * * ?",
        datetime(2024, 4, 25, 22, tzinfo=CAIRO),
        "2024-04-26T02:00+03:00",
        "2024-04-26T04:00+03:00",
    )
    assert_zoned_chain(
        "0 0 0 * * *", datetime(2024, 4, 25, 12, tzinfo=CAIRO), "2024-04-27T00:00+03:00"
    )
    assert_zoned_chain(
        "0 * * * * *", datetime(2024, 4, 25, 23, 59, tzinfo=CAIRO), "2024-04-26T01:00+03:00"
    )


def test_cairo_overlap() -> None:
    assert_zoned_chain(
        "0 30 23 * * *",
        datetime(2024, 10, 31, 12, tzinfo=CAIRO),
        "2024-10-31T23:30+03:00",
        "2024-10-31T23:30+02:00",
        "2024-11-01T23:30+02:00",
    )
