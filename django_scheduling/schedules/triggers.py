"""When a task fires: cron, fixed rate, fixed delay and one-shot triggers.

Triggers are pure: they compute the next fire time from their arguments, with no stored state
and no clock of their own. What they need to know of the past (a fixed-rate task's anchor, the
last fire time that ran, when the last run finished) comes in as a ``TriggerState``, which the
scheduler keeps in the database so that every instance computes the same times.

All datetimes in and out are aware; the scheduler works in UTC.

Triggers are immutable, so ``make_trigger`` hands out one trigger for identical arguments:
ten thousand tasks declared alike share one trigger and one parsed cron expression.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Protocol, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .cron import CronExpression
from .durations import DurationLike, format_duration, parse_duration

__all__ = [
    "MissedRuns",
    "TriggerState",
    "Trigger",
    "CronTrigger",
    "FixedRateTrigger",
    "FixedDelayTrigger",
    "OneShotTrigger",
    "make_trigger",
    "parse_zone",
    "jitter_offset",
    "kept_state",
    "reads_last_finished",
    "MISSED_COUNT_LIMIT",
]


class MissedRuns(enum.StrEnum):
    """What to do with fire times that passed while a run overran or no scheduler was up."""

    #: Run once as soon as possible for the newest missed fire time, then go on as planned.
    COALESCE = "coalesce"
    #: Run every missed fire time, one after the other (Spring's fixed-rate behaviour).
    RUN_ALL = "run_all"
    #: Drop the missed fire times and wait for the next one in the future.
    SKIP = "skip"

    @classmethod
    def parse(cls, value: MissedRuns | str) -> MissedRuns:
        try:
            return cls(value)
        except ValueError:
            options = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"missed={value!r} is not a policy; use one of {options}") from None


@dataclass(frozen=True, slots=True)
class TriggerState:
    """What a trigger needs to know of the past; all fields are UTC or ``None``."""

    #: When the task was first scheduled (a fixed-rate task's grid starts here).
    anchor: datetime | None = None
    #: The newest fire time that has been run (or claimed by a run).
    last_fire_time: datetime | None = None
    #: When the newest run finished (kept only for triggers that count from it).
    last_finished: datetime | None = None


#: The states tasks keep, each once (see ``kept_state``); forgotten past this many.
_KEPT_STATES_MAX = 1024
_kept_states: dict[TriggerState, TriggerState] = {}


def kept_state(trigger: Trigger, state: TriggerState) -> TriggerState:
    """Return *state* as a task with *trigger* keeps it: without ``last_finished`` unless the
    trigger counts from it, and as the same object as an equal state kept before.

    After a burst, the thousands of tasks on one cron line are in one state, and keep one
    object instead of one each (with a datetime of its own for the end of each run).
    """
    if reads_last_finished(trigger):
        return state  # the end of each run: a state per task, nothing to share
    if state.last_finished is not None:
        state = TriggerState(state.anchor, state.last_fire_time)
    kept = _kept_states.setdefault(state, state)
    if len(_kept_states) > _KEPT_STATES_MAX:
        _kept_states.clear()  # the states of past fire times: those in use stay shared
    return kept


def reads_last_finished(trigger: Trigger) -> bool:
    """Return whether *trigger* counts from the end of the last run (see ``Trigger``)."""
    return getattr(trigger, "uses_last_finished", True)


class Trigger(Protocol):
    """What the scheduler asks of a trigger. A trigger may also say, with a class attribute
    ``uses_last_finished = False``, that ``next_fire_time`` never reads ``state.last_finished``;
    tasks then keep one shared state (see ``kept_state``)."""

    kind: str

    def next_fire_time(self, *, now: datetime, state: TriggerState) -> datetime | None:
        """Return the fire time to run next, which is *now* or earlier when it is overdue."""

    def initial_anchor(self, *, now: datetime) -> datetime:
        """Return the anchor of a task first scheduled at *now*."""

    def describe(self) -> str:
        """Return the trigger in words, e.g. ``"every 30s"``."""

    def missed_before(self, due: datetime, *, state: TriggerState) -> int:
        """Return how many fire times of the schedule come before *due* and after the last
        one run (*state*): those a missed-runs policy coalesced into *due* or skipped. At
        most ``MISSED_COUNT_LIMIT``."""


#: ``missed_before`` counts at most this many fire times: an every-second task that no
#: scheduler ran for a month is not walked second by second.
MISSED_COUNT_LIMIT = 10_000


class _Series(Protocol):
    """A series of fire times, for applying a missed-runs policy."""

    def first_after(self, moment: datetime) -> datetime | None: ...

    def last_at_or_before(self, moment: datetime, known: datetime) -> datetime: ...


#: A fire time late by no more than this still runs, late: it is not "missed".
DEFAULT_MISFIRE_THRESHOLD = timedelta(seconds=5)


class _Described:
    """Describe a trigger once: it is immutable, and every task that shares it keeps the text."""

    __slots__ = ("_description",)
    _description: str
    uses_last_finished = False

    def describe(self) -> str:
        """Return the trigger in words, e.g. ``"every 30s"``."""
        try:
            return self._description
        except AttributeError:  # the first call (or the first since unpickling)
            description = self._describe()
            object.__setattr__(self, "_description", description)
            return description

    def _describe(self) -> str:
        raise NotImplementedError


def _apply_missed(
    first_due: datetime | None,
    now: datetime,
    missed: MissedRuns,
    series: _Series,
    threshold: timedelta,
) -> datetime | None:
    """Apply the missed-runs policy to *first_due*, the earliest fire time not yet run.

    Only a fire time late by more than *threshold* counts as missed. Below it, the fire time
    runs, late: a short pause does not drop runs, and an instance whose clock runs ahead of
    the others does not skip fire times that have not yet come for them.
    """
    if first_due is None or first_due >= now - threshold or missed is MissedRuns.RUN_ALL:
        return first_due
    if missed is MissedRuns.SKIP:
        return series.first_after(now - timedelta(microseconds=1))
    return series.last_at_or_before(now, first_due)


@dataclass(frozen=True, slots=True)
class CronTrigger(_Described):
    """Fire at the times a cron expression matches, on the wall clock of *zone*."""

    expression: CronExpression
    zone: tzinfo = UTC
    missed: MissedRuns = MissedRuns.COALESCE
    misfire_threshold: timedelta = DEFAULT_MISFIRE_THRESHOLD
    kind = "cron"

    def initial_anchor(self, *, now: datetime) -> datetime:
        return now

    def next_fire_time(self, *, now: datetime, state: TriggerState) -> datetime | None:
        # Matches before the task was first scheduled are not "missed": start at the anchor.
        start = state.last_fire_time or state.anchor or now
        return _apply_missed(
            self.first_after(start), now, self.missed, self, self.misfire_threshold
        )

    def first_after(self, moment: datetime) -> datetime | None:
        local = self.expression.next(moment.astimezone(self.zone))
        return None if local is None else local.astimezone(UTC)

    def missed_before(self, due: datetime, *, state: TriggerState) -> int:
        start = state.last_fire_time or state.anchor
        if start is None:
            return 0
        count = 0
        moment = self.first_after(start)
        while moment is not None and moment < due and count < MISSED_COUNT_LIMIT:
            count += 1
            moment = self.first_after(moment)
        return count

    def last_at_or_before(self, moment: datetime, known: datetime) -> datetime:
        """Return the newest match at or before *moment*, or *known* (an older match).

        Cron cannot step backwards, so look back from *moment* through a window that doubles
        until it holds a match: after a month away, an every-second expression is not walked
        second by second, and a yearly one takes a few dozen steps.
        """
        window = timedelta(seconds=1)
        while True:
            start = moment - window
            latest = known if start <= known else None
            candidate = self.first_after(max(start, known))
            while candidate is not None and candidate <= moment:
                latest = candidate
                candidate = self.first_after(candidate)
            if latest is not None:
                return latest
            window *= 2

    def _describe(self) -> str:
        return f"cron {self.expression} {getattr(self.zone, 'key', self.zone)}"


@dataclass(frozen=True)
class _Grid:
    anchor: datetime
    period: timedelta

    def first_after(self, moment: datetime) -> datetime:
        if moment < self.anchor:
            return self.anchor
        return self.anchor + ((moment - self.anchor) // self.period + 1) * self.period

    def last_at_or_before(self, moment: datetime, known: datetime) -> datetime:
        if moment < self.anchor:
            return known
        return self.anchor + ((moment - self.anchor) // self.period) * self.period


@dataclass(frozen=True, slots=True)
class FixedRateTrigger(_Described):
    """Fire on the grid ``anchor + k * period``; the anchor is the first fire time."""

    period: timedelta
    initial_delay: timedelta = timedelta(0)
    missed: MissedRuns = MissedRuns.COALESCE
    misfire_threshold: timedelta = DEFAULT_MISFIRE_THRESHOLD
    kind = "fixed_rate"

    def __post_init__(self) -> None:
        if self.period <= timedelta(0):
            raise ValueError(f"fixed_rate must be greater than zero, got {self.period}")

    def initial_anchor(self, *, now: datetime) -> datetime:
        return now + self.initial_delay

    def next_fire_time(self, *, now: datetime, state: TriggerState) -> datetime | None:
        anchor = state.anchor or self.initial_anchor(now=now)
        last = state.last_fire_time
        if last is None or last < anchor:
            first_due = anchor
        else:  # _Grid.first_after(last), inlined: this runs after every firing
            first_due = anchor + ((last - anchor) // self.period + 1) * self.period
        if first_due >= now - self.misfire_threshold:
            return first_due
        grid = _Grid(anchor, self.period)
        return _apply_missed(first_due, now, self.missed, grid, self.misfire_threshold)

    def missed_before(self, due: datetime, *, state: TriggerState) -> int:
        anchor, last = state.anchor, state.last_fire_time
        if anchor is None:
            return 0
        if last is None or last < anchor:
            first = anchor
        else:
            first = _Grid(anchor, self.period).first_after(last)
        if due <= first:
            return 0
        return min(-(-(due - first) // self.period), MISSED_COUNT_LIMIT)

    def _describe(self) -> str:
        text = f"every {format_duration(self.period)}"
        if self.initial_delay:
            text += f", first after {format_duration(self.initial_delay)}"
        return text


@dataclass(frozen=True, slots=True)
class FixedDelayTrigger(_Described):
    """Fire *delay* after the previous run finished; the first run after *initial_delay*."""

    delay: timedelta
    initial_delay: timedelta = timedelta(0)
    kind = "fixed_delay"
    uses_last_finished = True

    def __post_init__(self) -> None:
        if self.delay <= timedelta(0):
            raise ValueError(f"fixed_delay must be greater than zero, got {self.delay}")

    def initial_anchor(self, *, now: datetime) -> datetime:
        return now + self.initial_delay

    def next_fire_time(self, *, now: datetime, state: TriggerState) -> datetime | None:
        if state.last_fire_time is None:
            return state.anchor or self.initial_anchor(now=now)
        if state.last_finished is not None and state.last_finished >= state.last_fire_time:
            return state.last_finished + self.delay
        # The newest run never finished (its process died): count from when it started.
        return state.last_fire_time + self.delay

    def missed_before(self, due: datetime, *, state: TriggerState) -> int:
        return 0  # each fire time counts from the end of the run before it: none is missed

    def _describe(self) -> str:
        text = f"{format_duration(self.delay)} after each run"
        if self.initial_delay:
            text += f", first after {format_duration(self.initial_delay)}"
        return text


@dataclass(frozen=True, slots=True)
class OneShotTrigger(_Described):
    """Fire once, at *at*; at once if *at* has passed and the task never ran."""

    at: datetime
    kind = "one_shot"

    def __post_init__(self) -> None:
        if self.at.tzinfo is None:
            raise ValueError(f"at={self.at.isoformat()} must be an aware datetime")

    def initial_anchor(self, *, now: datetime) -> datetime:
        return self.at.astimezone(UTC)

    def next_fire_time(self, *, now: datetime, state: TriggerState) -> datetime | None:
        if state.last_fire_time is not None:
            return None
        return self.at.astimezone(UTC)

    def missed_before(self, due: datetime, *, state: TriggerState) -> int:
        return 0  # one fire time, never missed: it runs late

    def _describe(self) -> str:
        return f"once at {self.at.isoformat()}"


def jitter_offset(name: str, fire_time: datetime, jitter: timedelta) -> timedelta:
    """Return the delay in [0, *jitter*) of task *name*'s firing at *fire_time*.

    A hash of the two, not a random draw: every instance computes the same delay, so the
    firing is still claimed once, and the firings of many tasks due at one instant spread
    evenly over the jitter.
    """
    if jitter <= timedelta(0):
        return timedelta(0)
    key = f"{name}\x00{fire_time.astimezone(UTC).isoformat()}".encode()
    fraction = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64
    return timedelta(microseconds=int(fraction * (jitter // timedelta(microseconds=1))))


def parse_zone(zone: tzinfo | str) -> tzinfo:
    """Return *zone* as a ``tzinfo``; raise ``ValueError`` for an unknown name."""
    if not isinstance(zone, str):
        return zone
    try:
        return ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {zone!r}; use an IANA name such as 'Europe/Berlin' or 'UTC'"
        ) from None


def make_trigger(
    *,
    cron: str | CronExpression | None = None,
    zone: tzinfo | str | None = None,
    fixed_rate: DurationLike | None = None,
    fixed_delay: DurationLike | None = None,
    initial_delay: DurationLike | None = None,
    at: datetime | None = None,
    missed: MissedRuns | str = MissedRuns.COALESCE,
    default_zone: tzinfo = UTC,
    misfire_threshold: timedelta = DEFAULT_MISFIRE_THRESHOLD,
) -> Trigger:
    """Build the trigger that ``@scheduled``'s options describe, or raise ``ValueError``.

    Identical arguments give the same trigger (triggers are immutable), and a cron expression
    is parsed once per text.
    """
    arguments = {
        "cron": cron,
        "zone": zone,
        "fixed_rate": fixed_rate,
        "fixed_delay": fixed_delay,
        "initial_delay": initial_delay,
        "at": at,
        "missed": missed,
        "default_zone": default_zone,
        "misfire_threshold": misfire_threshold,
    }
    key = trigger_key(**arguments)
    if key is None:
        return _build_trigger(**arguments)  # type: ignore[arg-type]
    return _cached_trigger(key)


#: Argument types whose equal values are interchangeable: whichever of them a trigger is built
#: from, it is the same trigger. A ``ZoneInfo`` equals itself only. Not in the list, and never
#: cached: ``datetime`` (equal instants in other zones read differently), ``CronExpression``
#: (equal schedules may be written differently), other ``tzinfo`` classes, subclasses.
_INTERCHANGEABLE = frozenset({str, int, float, timedelta, MissedRuns, ZoneInfo, type(None)})
_TRIGGER_CACHE_SIZE = 1024

_CacheKey = tuple[tuple[str, type, object, str | None], ...]


def trigger_key(**arguments: object) -> _CacheKey | None:
    """Return a key equal for arguments that build the same trigger, or ``None`` when one of
    them is of a type whose equal values may build different ones."""
    key: list[tuple[str, type, object, str | None]] = []
    for name, value in arguments.items():
        kind = type(value)
        if kind is timezone:
            # Fixed offsets compare by offset alone; the name shows in the description.
            key.append((name, kind, value, cast(timezone, value).tzname(None)))
        elif kind in _INTERCHANGEABLE:
            key.append((name, kind, value, None))
        else:
            return None
    return tuple(key)


@functools.lru_cache(maxsize=_TRIGGER_CACHE_SIZE)
def _cached_trigger(key: _CacheKey) -> Trigger:
    return _build_trigger(**{name: value for name, _, value, _ in key})  # type: ignore[arg-type]


def _build_trigger(
    *,
    cron: str | CronExpression | None,
    zone: tzinfo | str | None,
    fixed_rate: DurationLike | None,
    fixed_delay: DurationLike | None,
    initial_delay: DurationLike | None,
    at: datetime | None,
    missed: MissedRuns | str,
    default_zone: tzinfo,
    misfire_threshold: timedelta,
) -> Trigger:
    options = {"cron": cron, "fixed_rate": fixed_rate, "fixed_delay": fixed_delay, "at": at}
    given = [name for name, value in options.items() if value is not None]
    if len(given) != 1:
        raise ValueError(
            "give exactly one of cron=, fixed_rate=, fixed_delay= or at=, "
            f"got {', '.join(name + '=' for name in given) if given else 'none'}"
        )
    if cron is not None and not isinstance(cron, str | CronExpression):
        raise ValueError(
            f"cron={cron!r} must be a cron expression in a string, e.g. cron='0 */5 * * * *'"
        )
    if zone is not None and not isinstance(zone, str | tzinfo):
        raise ValueError(
            f"zone={zone!r} must be a time zone name such as 'Europe/Berlin', or a tzinfo"
        )
    if at is not None and not isinstance(at, datetime):
        raise ValueError(
            f"at={at!r} must be an aware datetime, e.g. datetime(2027, 1, 1, tzinfo=UTC)"
        )
    if not isinstance(missed, str):
        raise ValueError(f"missed={missed!r} must be one of 'coalesce', 'run_all' or 'skip'")
    policy = MissedRuns.parse(missed)
    if zone is not None and cron is None:
        raise ValueError(f"zone= applies to cron= only, not to {given[0]}=")
    if initial_delay is not None and given[0] in ("cron", "at"):
        raise ValueError(
            f"initial_delay= applies to fixed_rate= and fixed_delay= only, not to {given[0]}="
        )
    if missed != MissedRuns.COALESCE and given[0] in ("fixed_delay", "at"):
        raise ValueError(f"missed= applies to cron= and fixed_rate= only, not to {given[0]}=")
    delay = parse_duration(0 if initial_delay is None else initial_delay, name="initial_delay")
    if cron is not None:
        expression = cron if isinstance(cron, CronExpression) else CronExpression.parse(cron)
        zone_info = parse_zone(zone) if zone else default_zone
        return CronTrigger(expression, zone_info, policy, misfire_threshold)
    if fixed_rate is not None:
        period = parse_duration(fixed_rate, name="fixed_rate", allow_zero=False)
        return FixedRateTrigger(period, delay, policy, misfire_threshold)
    if fixed_delay is not None:
        period = parse_duration(fixed_delay, name="fixed_delay", allow_zero=False)
        return FixedDelayTrigger(period, delay)
    assert at is not None
    return OneShotTrigger(at)
