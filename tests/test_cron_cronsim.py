"""
Five-field cron lines against cronsim, a cron evaluator that follows Debian's (Vixie) cron.

A seeded random corpus of five-field lines (no ``L``, ``W`` or ``#``) must give the same chains of
next fire times as cronsim: on the plain wall clock, and in Europe/Berlin and America/New_York with
starts around their DST transitions. A smaller corpus checks the ``L``, ``LW``, ``dL`` and ``d#n``
tokens, which cronsim supports with the same meaning.

One difference is deliberate (see "Cron expressions" in docs/tasks.md): daylight-saving transitions
follow one rule for all expressions, Spring's. cronsim copies Debian cron for five-field lines
whose minute and hour fields both do not start with ``*``: such a time skipped by a spring-forward
gap fires right after the gap, and such a time repeated by a fall-back overlap fires only on its
first pass; here the skipped time does not fire and the repeated one fires on both passes. For
those lines, and only those, the zoned comparison leaves out cronsim's gap-shifted times and our
second-pass times; everything else must be equal.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from functools import cache
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from .cron_chain import chain

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
SEED = 20261122
CORPUS_SIZE = 1500
QUARTZ_CORPUS_SIZE = 300
STEPS = 6
SHOWN = 10

MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# low, high, names (the name of value v is names[v - low]), chance of a plain "*"
MINUTE = (0, 59, None, 0.1)
HOUR = (0, 23, None, 0.15)
DAY_OF_MONTH = (1, 31, None, 0.35)
MONTH = (1, 12, MONTHS, 0.5)
DAY_OF_WEEK = (0, 7, DAYS, 0.35)

Field = tuple[int, int, tuple[str, ...] | None, float]
# compare(index, line) returns what differs for one line of a corpus, or None.
Compare = Callable[[int, str], str | None]


def _value(rng: random.Random, field: Field, value: int) -> str:
    low, _, names, _ = field
    if names and value - low < len(names) and rng.random() < 0.3:
        name = names[value - low]
        return rng.choice((name, name.lower(), name.title()))
    return str(value)


def _element(rng: random.Random, field: Field) -> str:
    low, high, _, _ = field
    start = rng.randint(low, high)
    end = rng.randint(start, high)
    step = rng.choice((1, 2, 2, 3, 3, 4, 5, 6, 7, 10, 15, rng.randint(1, high - low + 1)))
    kind = rng.choices(("value", "range", "star", "range-step", "start-step"), (5, 3, 2, 1, 1))[0]
    if kind == "value":
        return _value(rng, field, start)
    if kind == "range":
        return f"{_value(rng, field, start)}-{_value(rng, field, end)}"
    if kind == "star":
        return f"*/{step}"
    if kind == "range-step" and start < end:
        # Not "a-a/n": cronsim reads it as "a/n" (a to the end of the field), cron as just a.
        return f"{_value(rng, field, start)}-{_value(rng, field, end)}/{step}"
    if kind == "range-step":
        return _value(rng, field, start)
    return f"{_value(rng, field, start)}/{step}"


def _field(rng: random.Random, field: Field) -> str:
    if rng.random() < field[3]:
        return "*"
    return ",".join(_element(rng, field) for _ in range(rng.choice((1, 1, 1, 2, 3))))


def _quartz_day_fields(rng: random.Random) -> tuple[str, str]:
    """Return day fields where at least one holds a token that cronsim also knows."""
    day_of_month, day_of_week = _field(rng, DAY_OF_MONTH), _field(rng, DAY_OF_WEEK)
    tokens = [
        f"{rng.randint(0, 7)}L",
        f"{rng.randint(0, 7)}#{rng.randint(1, 5)}",
        f"{rng.choice(DAYS)}#{rng.randint(1, 5)}",
    ]
    if rng.random() < 0.5:
        token = rng.choice(("L", "LW"))
        day_of_month = token if day_of_month == "*" else f"{day_of_month},{token}"
    if rng.random() < 0.6 or "L" not in day_of_month:
        token = rng.choice(tokens)
        day_of_week = token if day_of_week == "*" else f"{day_of_week},{token}"
    return day_of_month, day_of_week


def _line(rng: random.Random, *, quartz: bool = False) -> str:
    day_of_month, day_of_week = (
        _quartz_day_fields(rng) if quartz else (_field(rng, DAY_OF_MONTH), _field(rng, DAY_OF_WEEK))
    )
    return " ".join(
        (_field(rng, MINUTE), _field(rng, HOUR), day_of_month, _field(rng, MONTH), day_of_week)
    )


def _naive_start(rng: random.Random) -> datetime:
    start = datetime(2024, 1, 1) + timedelta(seconds=rng.randrange(7 * 365 * 86_400))
    return start.replace(microsecond=rng.choice((0, rng.randrange(1_000_000))))


def _is_ambiguous_or_missing(moment: datetime) -> bool:
    first, second = moment.replace(fold=0), moment.replace(fold=1)
    return first.utcoffset() != second.utcoffset()


def _transition_days(zone: tzinfo, year: int) -> list[datetime]:
    """Return the midnights (naive) of the days in *year* on which *zone*'s offset changes."""
    days = []
    day = datetime(year, 1, 1)
    while day.year == year:
        if (
            day.replace(tzinfo=zone).utcoffset()
            != (day + timedelta(days=1)).replace(tzinfo=zone).utcoffset()
        ):
            days.append(day)
        day += timedelta(days=1)
    return days


@cache
def _transitions(zone: tzinfo) -> list[datetime]:
    return [day for year in range(2024, 2031) for day in _transition_days(zone, year)]


def _zoned_start(rng: random.Random, zone: tzinfo) -> datetime:
    """Return a start that is neither in a gap nor in an overlap, often just before a change."""
    while True:
        if rng.random() < 0.6:
            day = rng.choice(_transitions(zone))
            start = day + timedelta(seconds=rng.randrange(-30 * 3600, 4 * 3600))
        else:
            start = _naive_start(rng).replace(microsecond=0)
        aware = start.replace(tzinfo=zone)
        if not _is_ambiguous_or_missing(aware):
            return aware


def _accepted_by_cronsim(line: str) -> bool:
    try:
        CronSim(line, datetime(2024, 1, 1))
    except CronSimError:
        return False
    return True


@cache
def corpus(size: int, seed: int, *, quartz: bool = False) -> list[str]:
    """Return *size* distinct five-field lines that cronsim accepts, the same on every run."""
    rng = random.Random(seed)
    lines: dict[str, None] = {}
    while len(lines) < size:
        line = _line(rng, quartz=quartz)
        # cronsim rejects a line whose days of the month no allowed month has ("31 nov *").
        if line not in lines and _accepted_by_cronsim(line):
            lines[line] = None
    return list(lines)


def cronsim_chain(line: str, start: datetime, count: int) -> list[datetime | None]:
    """Return cronsim's next *count* fire times after *start*, ending with None if it gives up."""
    iterator = CronSim(line, start)
    results: list[datetime | None] = []
    for _ in range(count):
        try:
            results.append(next(iterator))
        except StopIteration:  # cronsim gives up after 50 years without a match.
            results.append(None)
            break
    return results


def _differences(lines: list[str], compare: Compare) -> list[str]:
    differences = []
    for index, line in enumerate(lines):
        problem = compare(index, line)
        if problem:
            differences.append(f"{line!r}: {problem}")
    return differences


def _report(differences: list[str], total: int) -> str:
    shown = "\n".join(differences[:SHOWN])
    return f"{len(differences)} of {total} lines differ from cronsim, for example:\n{shown}"


def _compare_naive(seed: int) -> Compare:
    rng = random.Random(seed)

    def compare(index: int, line: str) -> str | None:
        start = _naive_start(rng)
        theirs = cronsim_chain(line, start, STEPS)
        ours = chain(line, start, len(theirs))
        if ours != theirs:
            return f"from {start}: ours {_show(ours)}, cronsim {_show(theirs)}"
        return None

    return compare


def _show(values: list[datetime | None]) -> str:
    return "[" + ", ".join("None" if v is None else v.isoformat() for v in values) + "]"


def _applies_debian_dst_rule(line: str) -> bool:
    """Whether cronsim treats *line* like a fixed-time job for DST (see the module docstring)."""
    minute, hour = line.split()[:2]
    return not minute.startswith("*") and not hour.startswith("*")


def _without_deliberate_differences(
    line: str, ours: list[datetime | None], theirs: list[datetime | None]
) -> tuple[list[datetime | None], list[datetime | None]]:
    if not _applies_debian_dst_rule(line):
        return ours, theirs
    # cronsim moves a time skipped by a gap to the first minute after it; such a result is a
    # wall time the line does not name. In Berlin and New York gaps never cross midnight, so the
    # minute and hour tell.
    reference = CronSim(line, datetime(2024, 1, 1))
    theirs = [
        value
        for value in theirs
        if value is None or (value.minute in reference.minutes and value.hour in reference.hours)
    ]
    # We fire a repeated wall time on both passes; cronsim only on the first.
    ours = [value for value in ours if value is None or not value.fold]
    return ours, theirs


def _compare_zoned(seed: int, crossings: list[str]) -> Compare:
    """Compare chains in Berlin or New York; add each line whose chain crosses a change."""
    rng = random.Random(seed)

    def compare(index: int, line: str) -> str | None:
        zone = BERLIN if index % 2 else NEW_YORK
        start = _zoned_start(rng, zone)
        theirs = cronsim_chain(line, start, STEPS + 2)
        if len({value.utcoffset() for value in [start, *theirs] if value is not None}) > 1:
            crossings.append(line)
        ours = chain(line, start, len(theirs))
        ours, theirs = _without_deliberate_differences(line, ours, theirs)
        length = min(len(ours), len(theirs))
        ours, theirs = ours[:length], theirs[:length]
        # Compare instants and offsets: == within one zone ignores fold.
        if [_instant(v) for v in ours] != [_instant(v) for v in theirs]:
            return f"from {start}: ours {_show(ours)}, cronsim {_show(theirs)}"
        return None

    return compare


def _instant(value: datetime | None) -> tuple[datetime, object] | None:
    return None if value is None else (value.astimezone(UTC), value.utcoffset())


# --- The corpus itself -------------------------------------------------------------------------


def test_corpus_is_large_and_mixed() -> None:
    lines = corpus(CORPUS_SIZE, SEED)
    assert len(set(lines)) == CORPUS_SIZE
    fields = [line.split() for line in lines]
    both_days_restricted = [f for f in fields if f[2][0] != "*" and f[4][0] != "*"]
    day_of_week_steps = [f for f in fields if "/" in f[4]]
    assert len(both_days_restricted) > CORPUS_SIZE // 4
    assert len(day_of_week_steps) > CORPUS_SIZE // 10


def test_chains_match_cronsim_on_the_wall_clock() -> None:
    lines = corpus(CORPUS_SIZE, SEED)
    differences = _differences(lines, _compare_naive(SEED))
    assert not differences, _report(differences, len(lines))


def test_chains_match_cronsim_in_dst_zones() -> None:
    lines = corpus(CORPUS_SIZE, SEED)
    crossings: list[str] = []
    differences = _differences(lines, _compare_zoned(SEED + 1, crossings))
    assert not differences, _report(differences, len(lines))
    # Most starts are placed just before a change, so that many chains cross one.
    assert len(crossings) > CORPUS_SIZE // 3


def test_quartz_tokens_match_cronsim() -> None:
    lines = corpus(QUARTZ_CORPUS_SIZE, SEED + 2, quartz=True)
    differences = _differences(lines, _compare_naive(SEED + 3))
    differences += _differences(lines, _compare_zoned(SEED + 4, []))
    assert not differences, _report(differences, 2 * len(lines))
