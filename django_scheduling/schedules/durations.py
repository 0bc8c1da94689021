"""Turn the ways users write a duration into a ``timedelta``.

One parser serves every option that takes a duration: ``fixed_rate``, ``fixed_delay``,
``initial_delay``, the lock times and the ``SCHEDULING`` settings. It accepts

- a number of seconds (``30``, ``0.5``);
- a ``timedelta``;
- a string of one or more ``<number><unit>`` parts with the units ``ms``, ``s``, ``m``, ``h``
  and ``d`` (``"500ms"``, ``"30s"``, ``"10m"``, ``"2h"``, ``"1d"``, ``"1h30m"``);
- an ISO-8601 duration of days and time (``"PT10M"``, ``"P1DT2H"``, ``"PT0.5S"``).
"""

from __future__ import annotations

import functools
import math
import re
from datetime import timedelta

__all__ = ["DurationLike", "parse_duration", "format_duration"]

DurationLike = int | float | timedelta | str

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIMPLE_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*", re.IGNORECASE)
_HINT = 'write seconds as a number, a timedelta, "500ms", "30s", "10m", "2h", "1d" or "PT10M"'
#: An ISO-8601 duration of days and time (years and months are not fixed lengths).
_ISO = re.compile(
    r"(?P<sign>[-+]?)P(?:(?P<d>\d+(?:[.,]\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:[.,]\d+)?)H)?(?:(?P<m>\d+(?:[.,]\d+)?)M)?(?:(?P<s>\d+(?:[.,]\d+)?)S)?)?"
)
_ISO_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(
    value: DurationLike, *, name: str = "duration", allow_zero: bool = True
) -> timedelta:
    """Return *value* as a ``timedelta``.

    Raise ``ValueError`` naming *name* and the value when it cannot be read, is negative, or is
    zero while *allow_zero* is false.
    """
    result = _parse(value, name)
    if not allow_zero and result <= timedelta(0):
        raise ValueError(f"{name} must be positive, got {value!r}")
    if result < timedelta(0):
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return result


def _parse(value: DurationLike, name: str) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if type(value) in (str, int, float):
        try:
            return _read_cached(value)
        except ValueError:
            pass  # read it again, for a message that names *name*
    return _read(value, name)


@functools.lru_cache(maxsize=256, typed=True)
def _read_cached(value: DurationLike) -> timedelta:
    """Read *value*: the tasks that give the same duration ("10m", 30) share one timedelta."""
    return _read(value, "duration")


def _read(value: DurationLike, name: str) -> timedelta:
    if isinstance(value, bool):  # bool is an int; True seconds is surely a mistake
        raise ValueError(f"invalid {name} {value!r}: {_HINT}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"invalid {name} {value!r}: it must be a finite number of seconds")
        return timedelta(seconds=value)
    if not isinstance(value, str):
        raise ValueError(f"invalid {name} {value!r} of type {type(value).__name__}: {_HINT}")
    text = value.strip()
    if not text:
        raise ValueError(f"invalid {name} {value!r}: it is empty; {_HINT}")
    if text[0] in "pP" or text[:2] in ("-P", "-p"):
        return _parse_iso(text, value, name)
    if text[0] == "-" and text[1:].strip():
        # Read "-3s" as minus three seconds, so that the message says what is wrong with it.
        return -_parse_simple(text[1:].lstrip(), value, name)
    return _parse_simple(text, value, name)


def _parse_simple(text: str, original: str, name: str) -> timedelta:
    seconds = 0.0
    position = 0
    seen: set[str] = set()
    while position < len(text):
        match = _SIMPLE_PART.match(text, position)
        if match is None:
            raise ValueError(f"invalid {name} {original!r}: {_HINT}")
        unit = match.group(2).lower()
        if unit in seen:
            raise ValueError(f"invalid {name} {original!r}: the unit {unit!r} appears twice")
        seen.add(unit)
        seconds += float(match.group(1)) * _UNITS[unit]
        position = match.end()
    return timedelta(seconds=seconds)


def _parse_iso(text: str, original: str, name: str) -> timedelta:
    upper = text.upper()
    match = _ISO.fullmatch(upper)
    # "P" or "PT" alone, or a "T" with no time after it, would read as zero.
    if match is None or upper.rstrip("T").lstrip("+-") == "P" or upper.endswith("T"):
        raise ValueError(
            f"invalid {name} {original!r}: an ISO-8601 duration looks like 'PT10M' or 'P1DT2H' "
            "(years and months are not fixed lengths and are not accepted)"
        )
    seconds = sum(
        float(match[unit].replace(",", ".")) * size
        for unit, size in _ISO_UNITS.items()
        if match[unit] is not None
    )
    return timedelta(seconds=-seconds if match["sign"] == "-" else seconds)


def format_duration(delta: timedelta) -> str:
    """Return *delta* in the short form this module reads, e.g. ``"1h30m"`` or ``"500ms"``."""
    total_ms = round(delta.total_seconds() * 1000)
    if total_ms == 0:
        return "0s"
    sign, total_ms = ("-", -total_ms) if total_ms < 0 else ("", total_ms)
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        count, total_ms = divmod(total_ms, size)
        if count:
            parts.append(f"{count}{unit}")
    if total_ms:
        parts.append(f"{total_ms}ms")
    return sign + "".join(parts)
