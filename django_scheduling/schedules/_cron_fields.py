"""Parse the fields of a cron expression and compute which days of a month match.

This is the parsing half of :mod:`django_scheduling.cron`, which documents the syntax and its two
rule sets. Plain fields become bit sets (bit *n* set means value *n* is allowed). The two day fields
also keep their calendar-dependent tokens (``L``, ``L-n``, ``LW``, ``nW``, ``dL``, ``d#n``) as small
tuples that are evaluated per month by :func:`month_day_mask`. The rule sets differ only in the
day-of-week field (:data:`DAY_OF_WEEK` for Spring, :data:`CRON_DAY_OF_WEEK` for cron) and in how
the day fields combine (the *either* argument of :func:`month_day_mask`).

Errors are raised as :class:`FieldError` with a message that starts with the field name;
``CronExpression`` prefixes it with the whole expression.
"""

from __future__ import annotations

from typing import NamedTuple, TypeAlias

__all__ = [
    "ALL_DAYS_OF_MONTH",
    "ALL_WEEKDAYS",
    "ANY_DAY_OF_MONTH",
    "ANY_WEEKDAY",
    "CRON_DAY_OF_WEEK",
    "DAY_OF_MONTH",
    "DAY_OF_WEEK",
    "HOUR",
    "MINUTE",
    "MONTH",
    "NO_SPECIALS",
    "SECOND",
    "DaySpecial",
    "FieldError",
    "FieldSpec",
    "month_day_mask",
    "parse_days_of_month",
    "parse_days_of_week",
    "parse_field",
]

# Calendar-dependent day tokens:
#   day-of-month: ("L", n) = n days before the last day (n=0: the last day), ("LW", 0) = last
#   weekday, ("W", n) = weekday nearest to day n;
#   day-of-week: ("L", d) = last weekday d of the month, ("#", d, n) = n-th weekday d.
# Weekdays d are Python's (Monday=0 ... Sunday=6).
DaySpecial: TypeAlias = "tuple[str, int] | tuple[str, int, int]"


class FieldError(ValueError):
    """Describe what is wrong with one field of a cron expression."""


class FieldSpec(NamedTuple):
    """Describe one cron field: its name, allowed values and accepted names."""

    name: str
    low: int
    high: int
    names: dict[str, int] | None = None
    # What "*" covers; differs from *low* for day-of-week only, where "*" means 1-7 (Spring).
    wildcard_low: int | None = None
    is_day: bool = False


_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"), 1
    )
}
# Spring numbers days like java.time (Monday=1 ... Sunday=7); 0 is accepted for Sunday too.
_DAY_NAMES = {
    name: number for number, name in enumerate(("MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"), 1)
}
# Cron numbers days from Sunday=0 (7 is Sunday too), and so do its names.
_CRON_DAY_NAMES = {
    name: number for number, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
}

SECOND = FieldSpec("second", 0, 59)
MINUTE = FieldSpec("minute", 0, 59)
HOUR = FieldSpec("hour", 0, 23)
DAY_OF_MONTH = FieldSpec("day-of-month", 1, 31, is_day=True)
MONTH = FieldSpec("month", 1, 12, names=_MONTH_NAMES)
DAY_OF_WEEK = FieldSpec("day-of-week", 0, 7, names=_DAY_NAMES, wildcard_low=1, is_day=True)
# Five-field lines: "*" is 0-7, so "*/2" is Sunday, Tuesday, Thursday, Saturday (as in cron).
CRON_DAY_OF_WEEK = FieldSpec("day-of-week", 0, 7, names=_CRON_DAY_NAMES, is_day=True)

ALL_DAYS_OF_MONTH = ((1 << 32) - 1) & ~1  # bits 1-31
ALL_WEEKDAYS = (1 << 7) - 1  # bits 0-6, Python weekdays
#: A day field without special tokens; one shared set rather than an empty one per field.
NO_SPECIALS: frozenset[DaySpecial] = frozenset()
#: The parsed day fields that allow every day, shared by every expression that has them.
ANY_DAY_OF_MONTH = (ALL_DAYS_OF_MONTH, NO_SPECIALS)
ANY_WEEKDAY = (ALL_WEEKDAYS, NO_SPECIALS)

# _WEEKLY[f]: the days f, f+7, f+14, ... of a month, as a bit set.
_WEEKLY = [sum(1 << day for day in range(first, 32, 7)) if first else 0 for first in range(8)]


def _is_number(token: str) -> bool:
    return token.isascii() and token.isdigit()


def _parse_value(token: str, spec: FieldSpec, element: str) -> int:
    """Return the number that *token* (a number or a name) stands for in *spec*."""
    if _is_number(token):
        value = int(token)
    elif spec.names and token.upper() in spec.names:
        return spec.names[token.upper()]
    elif token == "":
        raise FieldError(f"{spec.name} element {element!r} is missing a value")
    elif spec is MONTH:
        raise FieldError(f"month value {token!r} is not a number 1-12 or a name JAN-DEC")
    elif spec is DAY_OF_WEEK:
        raise FieldError(f"day-of-week value {token!r} is not a number 0-7 or a name MON-SUN")
    elif spec is CRON_DAY_OF_WEEK:
        raise FieldError(f"day-of-week value {token!r} is not a number 0-7 or a name SUN-SAT")
    elif spec is DAY_OF_MONTH and token.upper() != token:
        raise FieldError(
            f"day-of-month value {token!r} is not a number; write 'L' and 'W' in upper case"
        )
    else:
        raise FieldError(f"{spec.name} value {token!r} is not a number")
    if not spec.low <= value <= spec.high:
        raise FieldError(f"{spec.name} value {value} is out of range {spec.low}-{spec.high}")
    return value


def _parse_element(element: str, spec: FieldSpec) -> int:
    """Return the bit set for one list element: ``*``, ``n``, ``a-b``, each with ``/step``."""
    range_part, slash, step_part = element.partition("/")
    step = 1
    if slash:
        if not _is_number(step_part):
            raise FieldError(f"{spec.name} step {step_part!r} in {element!r} is not a number")
        step = int(step_part)
        if step == 0:
            raise FieldError(f"{spec.name} step 0 in {element!r} must be 1 or higher")
    if range_part == "*":
        low = spec.low if spec.wildcard_low is None else spec.wildcard_low
        high = spec.high
    else:
        start, dash, end = range_part.partition("-")
        low = _parse_value(start, spec, element)
        if dash:
            high = _parse_value(end, spec, element)
            if spec is DAY_OF_WEEK and low == 7:
                low = 0  # Sunday starting a range means 0, so "SUN-FRI" is 0-5 (as in Spring).
            elif spec is CRON_DAY_OF_WEEK and high == 0 < low:
                high = 7  # Sunday ending a range means 7, so "FRI-SUN" is 5-7 (as in cronie).
            if low > high:
                raise FieldError(
                    f"{spec.name} range {range_part!r} is reversed ({low} > {high}); "
                    "write the smaller value first, ranges do not wrap around"
                )
        else:
            # "5/15" runs from 5 to the end of the field's range.
            high = spec.high if slash else low
    bits = 0
    for value in range(low, high + 1, step):
        bits |= 1 << value
    return bits


def _split_list(text: str, spec: FieldSpec) -> list[str]:
    elements = text.split(",")
    if "" in elements:
        raise FieldError(f"{spec.name} has an empty list element in {text!r}")
    if "?" in elements:
        if not spec.is_day:
            raise FieldError(f"{spec.name} does not accept '?'; use '*'")
        raise FieldError(f"{spec.name} '?' must stand alone, not in a list like {text!r}")
    return elements


def parse_field(text: str, spec: FieldSpec) -> int:
    """Parse a plain field (second, minute, hour, month) into a bit set."""
    bits = 0
    for element in _split_list(text, spec):
        bits |= _parse_element(element, spec)
    return bits


def parse_days_of_month(text: str) -> tuple[int, frozenset[DaySpecial]]:
    """Parse the day-of-month field into a bit set (bits 1-31) and its special tokens."""
    if text == "?":
        return ANY_DAY_OF_MONTH
    bits = 0
    specials: set[DaySpecial] = set()
    for element in _split_list(text, DAY_OF_MONTH):
        # Like Spring, only upper-case L and W are special in this field.
        if "L" in element or "W" in element:
            specials.add(_parse_day_of_month_special(element))
        else:
            bits |= _parse_element(element, DAY_OF_MONTH)
    if bits == ALL_DAYS_OF_MONTH:
        return ANY_DAY_OF_MONTH  # Special tokens cannot add anything to every day.
    return bits, frozenset(specials) if specials else NO_SPECIALS


def _parse_day_of_month_special(element: str) -> DaySpecial:
    if element == "L":
        return ("L", 0)
    if element == "LW":
        return ("LW", 0)
    if element.startswith("L-") and _is_number(element[2:]):
        offset = int(element[2:])
        if offset == 0:
            raise FieldError(f"day-of-month offset in {element!r} must be 1 or more; use 'L'")
        return ("L", offset)
    if element.endswith("W") and "L" not in element:
        day = element[:-1]
        if day == "":
            raise FieldError("day-of-month 'W' needs a day before it, e.g. '15W'")
        if not _is_number(day):
            raise FieldError(
                f"day-of-month value {element!r} is not valid; "
                "'W' follows a single day of the month, e.g. '15W'"
            )
        return ("W", _parse_value(day, DAY_OF_MONTH, element))
    raise FieldError(
        f"day-of-month value {element!r} is not valid; "
        "use 'L', 'L-3', 'LW' or a day followed by 'W' such as '15W'"
    )


def parse_days_of_week(
    text: str, spec: FieldSpec = DAY_OF_WEEK
) -> tuple[int, frozenset[DaySpecial]]:
    """
    Parse the day-of-week field into a bit set of Python weekdays and its special tokens.

    *spec* is :data:`DAY_OF_WEEK` (Spring's rules) or :data:`CRON_DAY_OF_WEEK` (cron's).
    """
    if text == "?":
        return ANY_WEEKDAY
    day_bits = 0  # bits 0-7, 0 and 7 being Sunday, in both rule sets
    specials: set[DaySpecial] = set()
    for element in _split_list(text, spec):
        element = element.upper()  # Spring upper-cases this whole field, so "fril" works.
        if "L" in element or "#" in element:
            specials.add(_parse_day_of_week_special(element, spec))
        else:
            day_bits |= _parse_element(element, spec)
    # Day d (Monday=1 ... Saturday=6, Sunday=0 or 7) is Python's weekday (d - 1) % 7.
    bits = (day_bits >> 1) | (day_bits & 1) << 6
    if bits == ALL_WEEKDAYS:
        return ANY_WEEKDAY
    return bits, frozenset(specials) if specials else NO_SPECIALS


def _parse_weekday(token: str, element: str, spec: FieldSpec) -> int:
    return (_parse_value(token, spec, element) - 1) % 7


def _parse_day_of_week_special(element: str, spec: FieldSpec) -> DaySpecial:
    if "#" in element:
        day, _, ordinal = element.partition("#")
        if day == "":
            raise FieldError(f"day-of-week value {element!r} needs a day before '#', e.g. 'FRI#2'")
        if ordinal == "":
            raise FieldError(
                f"day-of-week value {element!r} needs an ordinal after '#', e.g. 'FRI#2'"
            )
        weekday = _parse_weekday(day, element, spec)
        if not _is_number(ordinal):
            raise FieldError(f"day-of-week ordinal {ordinal!r} in {element!r} is not a number")
        if int(ordinal) == 0:
            raise FieldError(f"day-of-week ordinal in {element!r} must be 1 or more")
        return ("#", weekday, int(ordinal))
    if element == "L":
        raise FieldError(
            "day-of-week 'L' needs a day before it, e.g. '5L' or 'FRIL' for the last Friday; "
            "for the last day of the month use 'L' in day-of-month"
        )
    if element.endswith("L") and element.count("L") == 1:
        return ("L", _parse_weekday(element[:-1], element, spec))
    raise FieldError(
        f"day-of-week value {element!r} is not valid; 'L' follows a single day, e.g. '5L' or 'FRIL'"
    )


def month_day_mask(
    dom_bits: int,
    dom_specials: frozenset[DaySpecial],
    dow_bits: int,
    dow_specials: frozenset[DaySpecial],
    days_in_month: int,
    first_weekday: int,
    either: bool = False,
) -> int:
    """
    Return the days of one month that match the day fields, as a bit set.

    The month has *days_in_month* days and its 1st falls on *first_weekday* (Monday=0). A day
    matches if it matches both fields, or with *either* one of them (cron's rule when both fields
    are restricted).
    """
    last = days_in_month
    month = (1 << (last + 1)) - 2

    def weekday(day: int) -> int:
        return (first_weekday + day - 1) % 7

    def first(target: int) -> int:
        # The first day of the month that falls on weekday *target*.
        return 1 + (target - first_weekday) % 7

    by_month = dom_bits & month
    for special in dom_specials:
        kind, number = special[0], special[1]
        if kind == "L":
            day = last - number
        elif kind == "LW":
            day = last - max(0, weekday(last) - 4)  # Saturday -> Friday, Sunday -> Friday
        else:  # "W": the weekday nearest to day *number*, never leaving the month
            day = number
            if day > last:
                continue
            if weekday(day) == 5:  # Saturday: the Friday before, or Monday the 3rd for "1W"
                day = 3 if day == 1 else day - 1
            elif weekday(day) == 6:  # Sunday: the Monday after, if still in this month
                day += 1
        if 1 <= day <= last:
            by_month |= 1 << day

    if dow_bits == ALL_WEEKDAYS:
        by_week = month
    else:
        by_week = 0
        for target in range(7):
            if dow_bits >> target & 1:
                by_week |= _WEEKLY[first(target)]
        for special in dow_specials:
            if special[0] == "L":
                day = first(special[1])
                day += (last - day) // 7 * 7
            else:
                day = first(special[1]) + 7 * (special[2] - 1)  # type: ignore[misc]
            if day <= last:
                by_week |= 1 << day
        by_week &= month
    return by_month | by_week if either else by_month & by_week
