"""
Cron expressions: parse them and compute the next fire time.

Two forms are accepted, each with the rules of the tool it comes from. A six-field expression
``second minute hour day-of-month month day-of-week`` has Spring's syntax and meaning; a classic
five-field crontab line ``minute hour day-of-month month day-of-week`` fires at second 0 and has
the meaning it has in Vixie cron and cronie (Debian's cron)::

    ┌───────────── second (0-59; six fields only)
    │ ┌───────────── minute (0-59)
    │ │ ┌───────────── hour (0-23)
    │ │ │ ┌───────────── day of the month (1-31)
    │ │ │ │ ┌───────────── month (1-12 or JAN-DEC)
    │ │ │ │ │ ┌───────────── day of the week (0-7, 0 and 7 being Sunday, or names)
    * * * * * *

Each field takes ``*``, a number, a range ``a-b``, a step ``*/n``, ``a/n`` (from *a* to the end
of the range) or ``a-b/n``, and comma-separated lists of these. Names are case-insensitive. The
day fields also take ``?`` (same as ``*``) and Quartz's tokens: ``L`` (last day of the month),
``L-n`` (n days before it), ``LW`` (last weekday), ``nW`` (weekday nearest to day n, never leaving
the month) in day-of-month; ``dL`` (last weekday d of the month) and ``d#n`` (n-th weekday d) in
day-of-week. The two rule sets differ in the day fields only:

- Six fields (Spring): day-of-month and day-of-week must both match. A day-of-week ``*`` covers
  1-7 (MON-SUN), Monday first, so ``*/2`` is Monday, Wednesday, Friday, Sunday; a range starting
  at Sunday (``SUN-FRI``, ``7-5``) starts at 0.
- Five fields (cron): when both day fields are restricted, that is neither starts with ``*`` nor
  is ``?``, a day matching either one fires (``0 0 13 * 5`` fires on every 13th and every
  Friday); otherwise both must match, as above. A day-of-week ``*`` covers 0-7, Sunday first, so
  ``*/2`` is Sunday, Tuesday, Thursday, Saturday; names run SUN=0 to SAT=6; a range ending at
  Sunday (``FRI-SUN``, ``5-0``) ends at 7, and ``7-7`` is Sunday. Quartz's tokens, which cron
  does not have, keep their meaning and combine by the same either-or rule.

The macros ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and
``@hourly`` fire when they fire in cron; none restricts both day fields or steps over days of the
week, so both rule sets agree on them.

Time zones: an aware datetime is evaluated on its zone's wall clock. A wall time that does not
exist (a spring-forward gap) does not fire; a wall time that occurs twice (a fall-back overlap)
fires at both instants. This is what Spring does, for both forms, and it means hourly or minutely
expressions simply continue on the real clock across transitions. (Debian's cron runs a fixed-time
job skipped by a gap right after it, and a repeated one only once.)

This module is pure: it never reads the clock and does not depend on Django.
"""

from __future__ import annotations

import functools
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo

from ._cron_fields import (
    ANY_DAY_OF_MONTH,
    ANY_WEEKDAY,
    CRON_DAY_OF_WEEK,
    DAY_OF_WEEK,
    HOUR,
    MINUTE,
    MONTH,
    SECOND,
    FieldError,
    month_day_mask,
    parse_days_of_month,
    parse_days_of_week,
    parse_field,
)

__all__ = ["CronExpression", "InvalidCronExpression"]

MACROS = {
    "@yearly": "0 0 0 1 1 *",
    "@annually": "0 0 0 1 1 *",
    "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *",
    "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}

_FIELDS_HELP = (
    "6 fields 'second minute hour day-of-month month day-of-week' "
    "or 5 fields 'minute hour day-of-month month day-of-week'"
)
_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_MAX_YEAR = 9999
# The Gregorian calendar repeats every 400 years; a search that has not matched in that long
# never will. In practice the search stops much earlier, see CronExpression._fires().
_CYCLE_YEARS = 400
_MASK_CACHE_SIZE = 256
# Bounds of the caches that let many tasks share one parsed expression and its tables; a
# project has far fewer distinct expressions than these.
_PARSED_CACHE_SIZE = 1024
_TABLE_CACHE_SIZE = 512
_DAY_CACHES_SIZE = 256
_EPOCH = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)

# year, month, day, hour, minute, second
_Fields = tuple[int, int, int, int, int, int]


class InvalidCronExpression(ValueError):
    """Raised when a cron expression cannot be parsed; the message names the culprit."""


@functools.lru_cache(maxsize=_TABLE_CACHE_SIZE)
def _next_table(bits: int, size: int) -> tuple[int | None, ...]:
    """Return t where t[v] is the smallest allowed value >= v, or None (one extra slot).

    Expressions with the same field share the table: ``*`` in the minute of one and of another.
    """
    table: list[int | None] = [None] * (size + 1)
    following = None
    for value in range(size - 1, -1, -1):
        if bits >> value & 1:
            following = value
        table[value] = following
    return tuple(table)


def _first(bits: int) -> int:
    return (bits & -bits).bit_length() - 1


#: The matching days per (year, month) and per month shape (see ``_month_mask``) depend on the
#: day fields only, so expressions with the same day fields (most have ``* * *``) share them.
_day_caches: dict[tuple[object, ...], tuple[dict[int, int], dict[int, int]]] = {}


def _day_cache(key: tuple[object, ...]) -> tuple[dict[int, int], dict[int, int]]:
    cache = _day_caches.get(key)
    if cache is None:
        if len(_day_caches) >= _DAY_CACHES_SIZE:
            _day_caches.clear()  # expressions keep the caches they hold
        cache = _day_caches.setdefault(key, ({}, {}))
    return cache


class CronExpression:
    """
    A parsed cron expression that computes its fire times.

    Create one with ``CronExpression.parse(text)`` (or ``CronExpression(text)``), then call
    :meth:`next`. Instances are immutable, hashable and safe to share between threads:
    ``parse()`` returns the same instance for the same text.
    """

    __slots__ = (
        "_can_fire",
        "_days_of_month",
        "_days_of_week",
        "_either_day",
        "_first_hour",
        "_first_minute",
        "_first_month",
        "_first_second",
        "_hours",
        "_key",
        "_masks",
        "_masks_by_shape",
        "_minutes",
        "_months",
        "_seconds",
        "expression",
    )

    def __init__(self, expression: str) -> None:
        """Parse *expression*; raise InvalidCronExpression if it is not valid."""
        if not isinstance(expression, str):
            raise TypeError(f"a cron expression must be a str, not {type(expression).__name__}")
        self.expression = expression
        fields, cron_rules = self._split(expression)
        try:
            seconds = parse_field(fields[0], SECOND)
            minutes = parse_field(fields[1], MINUTE)
            hours = parse_field(fields[2], HOUR)
            days_of_month = parse_days_of_month(fields[3])
            months = parse_field(fields[4], MONTH)
            days_of_week = parse_days_of_week(
                fields[5], CRON_DAY_OF_WEEK if cron_rules else DAY_OF_WEEK
            )
        except FieldError as exc:
            raise self._error(str(exc)) from None
        # Cron's rule: when neither day field starts with "*" (or is "?"), either one matching
        # is enough. Vixie cron looks at the first character only, so "*/2" counts as "*".
        either_day = cron_rules and fields[3][0] not in "*?" and fields[5][0] not in "*?"
        if either_day and (days_of_month == ANY_DAY_OF_MONTH or days_of_week == ANY_WEEKDAY):
            # "1-31" or "0-7" with either-day matching is every day, whatever the other field
            # says; keep the key canonical so that equal schedules compare equal.
            days_of_month, days_of_week, either_day = ANY_DAY_OF_MONTH, ANY_WEEKDAY, False
        self._key = (seconds, minutes, hours, days_of_month, months, days_of_week, either_day)
        self._seconds = _next_table(seconds, 60)
        self._minutes = _next_table(minutes, 60)
        self._hours = _next_table(hours, 24)
        self._months = _next_table(months, 13)
        self._first_second = _first(seconds)
        self._first_minute = _first(minutes)
        self._first_hour = _first(hours)
        self._first_month = _first(months)
        self._days_of_month = days_of_month
        self._days_of_week = days_of_week
        self._either_day = either_day
        # Matching days per (year, month), filled lazily; races only recompute an entry. And
        # the same per month shape (length * 7 + weekday of the 1st): at most 28 entries.
        self._masks, self._masks_by_shape = _day_cache((days_of_month, days_of_week, either_day))
        self._can_fire: bool | None = None

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        """Parse *text*; raise InvalidCronExpression if it is not a valid cron expression.

        The same text gives the same instance (for the last thousand texts parsed), so that
        many tasks declared alike share one.
        """
        if cls is not CronExpression or type(text) is not str:
            return cls(text)
        return _parse(text)

    def _error(self, problem: str) -> InvalidCronExpression:
        return InvalidCronExpression(f"invalid cron expression '{self.expression}': {problem}")

    def _split(self, expression: str) -> tuple[list[str], bool]:
        """Return the six fields, and whether cron's rules apply (a five-field line)."""
        text = expression.strip()
        if not text:
            raise self._error(f"the expression is empty; expected {_FIELDS_HELP}")
        if text.startswith("@"):
            macro = MACROS.get(text.lower())
            if macro is None:
                known = ", ".join(MACROS)
                raise self._error(f"unknown macro {text!r}; use one of {known}")
            text = macro
        fields = text.split()
        if len(fields) == 5:
            return ["0", *fields], True
        if len(fields) != 6:
            hint = "; a year field is not supported" if len(fields) == 7 else ""
            raise self._error(f"expected {_FIELDS_HELP}, found {len(fields)}{hint}")
        return fields, False

    def __str__(self) -> str:
        return self.expression

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.expression!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CronExpression):
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self) -> tuple[type[CronExpression], tuple[str]]:
        return (type(self), (self.expression,))

    def next(self, after: datetime) -> datetime | None:
        """
        Return the first fire time strictly after *after*, or None if there is none.

        A naive *after* gives a naive result on the plain wall clock. An aware *after* gives a
        result in the same tzinfo, computed on that zone's wall clock: wall times skipped by a
        spring-forward transition do not fire, and wall times repeated by a fall-back transition
        fire once per offset (the second one with ``fold=1``).
        """
        if not isinstance(after, datetime):
            raise TypeError(f"after must be a datetime, not {type(after).__name__}")
        zone = after.tzinfo
        if zone is None or after.utcoffset() is None:
            found = self._after(after)
            return None if found is None else datetime(*found)
        if isinstance(zone, timezone):  # A fixed offset: the wall clock has no transitions.
            found = self._after(after)
            return None if found is None else datetime(*found, 0, zone)
        try:
            return self._next_zoned(after, zone)
        except OverflowError:  # Within hours of datetime.min or datetime.max.
            return None

    def _after(self, moment: datetime) -> _Fields | None:
        """Return the first matching wall time strictly after *moment*'s wall time."""
        return self._search(
            moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second + 1
        )

    def _at_or_after(self, moment: datetime) -> _Fields | None:
        """Return the first matching wall time at or after *moment* (a whole second)."""
        return self._search(
            moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second
        )

    def _next_zoned(self, after: datetime, zone: tzinfo) -> datetime | None:
        # Normalise through UTC: *after* may name a wall time that does not exist.
        instant = after.astimezone(UTC)
        local = instant.astimezone(zone)
        if not local.fold:
            fields = (local.year, local.month, local.day, local.hour, local.minute, local.second)
            earlier = local.utcoffset()
            later = datetime(*fields, 0, zone, fold=1).utcoffset()
            if earlier is not None and later is not None and later < earlier:
                return self._next_in_overlap(datetime(*fields), instant, zone, earlier, later)
        return self._resolve(self._after(local), instant, zone)

    def _next_in_overlap(
        self, wall: datetime, instant: datetime, zone: tzinfo, earlier: timedelta, later: timedelta
    ) -> datetime | None:
        """Return the next fire time after *wall*, in the first pass through a fall-back overlap."""
        change = _transition(zone, instant.replace(tzinfo=None), wall - later)
        overlap_start, overlap_end = change + later, change + earlier
        # The rest of the first pass comes first, then the whole second pass, then the rest.
        found = self._after(wall)
        if found is not None and datetime(*found) < overlap_end:
            return datetime(*found, 0, zone)
        found = self._at_or_after(overlap_start)
        if found is not None and datetime(*found) < overlap_end:
            return datetime(*found, 0, zone, fold=1)
        return self._resolve(found, instant, zone)

    def _resolve(self, found: _Fields | None, instant: datetime, zone: tzinfo) -> datetime | None:
        """
        Return the first instant after *instant* whose wall time in *zone* is *found* or the
        next matching one: skip wall times in gaps, pick the right pass through overlaps.
        """
        while found is not None:
            first = datetime(*found, 0, zone)
            earlier = first.utcoffset()
            second = datetime(*found, 0, zone, fold=1)
            later = second.utcoffset()
            if earlier == later or earlier is None or later is None:
                return first
            if later < earlier:  # An overlap: its first pass unless that is already over.
                return first if first.astimezone(UTC) > instant else second
            # A gap (PEP 495: fold=0 uses the offset before it): resume at its end.
            wall = datetime(*found)
            change = _transition(zone, wall - later, wall - earlier)
            found = self._at_or_after(change + later)
        return None

    def _search(
        self, year: int, month: int, day: int, hour: int, minute: int, second: int
    ) -> _Fields | None:
        """
        Return the first matching wall time at or after the given fields, or None.

        The fields may overflow by one (second=60, hour=24, day=32, month=13); each carries into
        the next larger field. Each field jumps straight to its next allowed value.
        """
        seconds, minutes, hours, months = self._seconds, self._minutes, self._hours, self._months
        first_second, first_minute = self._first_second, self._first_minute
        first_hour, first_month = self._first_hour, self._first_month
        masks = self._masks
        start, give_up = year, min(year + _CYCLE_YEARS, _MAX_YEAR)
        while True:
            following = months[month]
            if following is None:
                year += 1
                # Only a sparse expression gets here twice; check whether it can fire at all.
                if year > give_up or (year > start + 1 and not self._fires()):
                    return None
                month, day = first_month, 1
                hour, minute, second = first_hour, first_minute, first_second
                continue
            if following != month:
                month, day = following, 1
                hour, minute, second = first_hour, first_minute, first_second
            days = masks.get(year * 16 + month)
            if days is None:
                days = self._month_mask(year, month)
            days >>= day
            if not days:
                month, day = month + 1, 1
                hour, minute, second = first_hour, first_minute, first_second
                continue
            if not days & 1:
                day += _first(days)
                hour, minute, second = first_hour, first_minute, first_second
            following = hours[hour]
            if following is None:
                day, hour, minute, second = day + 1, first_hour, first_minute, first_second
                continue
            if following != hour:
                hour, minute, second = following, first_minute, first_second
            following = minutes[minute]
            if following is None:
                hour, minute, second = hour + 1, first_minute, first_second
                continue
            if following != minute:
                minute, second = following, first_second
            following = seconds[second]
            if following is None:
                minute, second = minute + 1, first_second
                continue
            return year, month, day, hour, minute, following

    def _month_mask(self, year: int, month: int) -> int:
        length = _DAYS_IN_MONTH[month]
        if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
            length = 29
        first_weekday = date(year, month, 1).weekday()
        # The matching days depend only on the month's length and the weekday of its 1st, so
        # sparse expressions that walk through centuries compute at most 28 masks.
        shape = length * 7 + first_weekday
        mask = self._masks_by_shape.get(shape)
        if mask is None:
            mask = month_day_mask(
                *self._days_of_month, *self._days_of_week, length, first_weekday, self._either_day
            )
            self._masks_by_shape[shape] = mask
        if len(self._masks) >= _MASK_CACHE_SIZE:
            self._masks.clear()
        self._masks[year * 16 + month] = mask
        return mask

    def _fires(self) -> bool:
        """Return whether any day can ever match (``0 0 0 30 2 *`` cannot)."""
        if self._can_fire is None:
            # Every month starts on every weekday somewhere in the 400-year cycle, so trying
            # each allowed month's lengths with each first weekday covers all calendars.
            self._can_fire = any(
                month_day_mask(
                    *self._days_of_month, *self._days_of_week, length, weekday, self._either_day
                )
                for month in range(1, 13)
                if self._months[month] == month
                for length in ((28, 29) if month == 2 else (_DAYS_IN_MONTH[month],))
                for weekday in range(7)
            )
        return self._can_fire


@functools.lru_cache(maxsize=_PARSED_CACHE_SIZE)
def _parse(text: str) -> CronExpression:
    return CronExpression(text)


def _offset_at(zone: tzinfo, moment: datetime) -> timedelta | None:
    """Return *zone*'s UTC offset at the naive UTC time *moment*."""
    return moment.replace(tzinfo=UTC).astimezone(zone).utcoffset()


def _transition(zone: tzinfo, before: datetime, after: datetime) -> datetime:
    """
    Return the instant (naive UTC) at which *zone*'s offset changes, between *before* and
    *after*, by bisection to the second; the offsets at *before* and *after* must differ.
    """
    target = _offset_at(zone, after)
    low = (before - _EPOCH) // _SECOND
    high = -((_EPOCH - after) // _SECOND)  # Rounded up.
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_at(zone, _EPOCH + middle * _SECOND) == target:
            high = middle
        else:
            low = middle
    return _EPOCH + high * _SECOND
