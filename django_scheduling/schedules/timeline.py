"""The firings of the next hours across all tasks, for the admin's timeline page.

Each task's firings come from its trigger and its stored state, as the scheduler computes them:
the next fire time from the row's state, then one after the other, each as if the one before
had just run (a fixed-delay task's runs are taken to take no time), each dispatched later by
the task's jitter offset. Pure: ``plan_firings()`` takes the plans and *now*; the admin reads
the plans from the task rows.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from .triggers import Trigger, TriggerState, jitter_offset

__all__ = [
    "HORIZON",
    "MAX_FIRINGS_PER_TASK",
    "MAX_FIRINGS",
    "TaskPlan",
    "Firing",
    "Timeline",
    "Minute",
    "plan_firings",
    "busiest_minutes",
]

#: How far ahead the timeline looks.
HORIZON = timedelta(hours=24)
#: The firings shown of one task: one a minute for a day. A task that fires more often would
#: otherwise fill the page: the timeline then ends where its firings stop.
MAX_FIRINGS_PER_TASK = 1_440
#: The firings shown in all: the timeline stops at the time this many are reached.
MAX_FIRINGS = 50_000


@dataclass(frozen=True, slots=True)
class TaskPlan:
    """What the timeline needs of a task: its trigger (``None`` when this process does not
    declare it as stored), its state, its jitter and its stored next fire time."""

    name: str
    trigger: Trigger | None
    state: TriggerState
    jitter: timedelta = timedelta(0)
    next_fire_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class Firing:
    """A task's firing: dispatched *at* (no earlier than the timeline's start)."""

    at: datetime
    name: str


@dataclass(frozen=True)
class Timeline:
    start: datetime
    end: datetime
    #: In time order, then by name.
    firings: list[Firing]
    #: Tasks cut at ``MAX_FIRINGS_PER_TASK``, with the time of the last firing shown.
    capped: dict[str, datetime] = field(default_factory=dict)
    #: Tasks shown at their stored next fire time only: their trigger is not known here.
    unknown: list[str] = field(default_factory=list)
    #: The firings are complete up to here: ``end``, or earlier when ``MAX_FIRINGS`` was
    #: reached, or a task's firings were cut at ``MAX_FIRINGS_PER_TASK``.
    complete_until: datetime | None = None

    @property
    def tasks(self) -> int:
        return len({firing.name for firing in self.firings})

    @property
    def shown_until(self) -> datetime:
        """The end of what the timeline shows: where it is complete (what its title says)."""
        return self.complete_until or self.end


def plan_firings(
    plans: Iterable[TaskPlan],
    *,
    now: datetime,
    horizon: timedelta = HORIZON,
    per_task: int = MAX_FIRINGS_PER_TASK,
    total: int = MAX_FIRINGS,
) -> Timeline:
    """Return the firings of *plans* from *now* until *now* + *horizon*.

    A firing already due is shown at *now*. The firings are merged in time order, so that
    when *total* is reached the timeline is complete up to that time; a task cut at *per_task*
    firings makes it complete up to its last one. The firings after that are left out: the
    timeline shows what it shows in full.
    """
    end = now + horizon
    # (dispatch time, name, fire time, plan, firings so far): a heap, earliest first.
    heap: list[tuple[datetime, str, datetime, int, TaskPlan]] = []
    unknown = []
    for plan in plans:
        if plan.trigger is None:
            unknown.append(plan.name)
            fire_time = plan.next_fire_time
        else:
            fire_time = plan.trigger.next_fire_time(now=now, state=plan.state)
        if fire_time is None:
            continue
        # A stored next fire time is already the dispatch time.
        at = fire_time if plan.trigger is None else _dispatch(plan, fire_time)
        if at < end:
            heap.append((at, plan.name, fire_time, 0, plan))
    heapq.heapify(heap)
    firings: list[Firing] = []
    capped: dict[str, datetime] = {}
    while heap and len(firings) < total:
        at, name, fire_time, count, plan = heapq.heappop(heap)
        firings.append(Firing(max(at, now), name))
        if plan.trigger is None:
            continue
        # As if this firing had just run: a fixed-delay task's run is taken to end at once.
        after = replace(plan.state, last_fire_time=fire_time, last_finished=max(at, fire_time))
        following = plan.trigger.next_fire_time(now=fire_time, state=after)
        if following is None or following <= fire_time:
            continue
        if (next_at := _dispatch(plan, following)) >= end:
            continue
        if count + 1 >= per_task:
            capped[name] = max(at, now)
            continue
        plan = replace(plan, state=after)
        heapq.heappush(heap, (next_at, name, following, count + 1, plan))
    complete_until = min([heap[0][0] if heap else end, *capped.values()])
    if complete_until < end:
        firings = [firing for firing in firings if firing.at <= complete_until]
    return Timeline(now, end, firings, capped, sorted(unknown), complete_until)


def _dispatch(plan: TaskPlan, fire_time: datetime) -> datetime:
    if not plan.jitter:
        return fire_time
    return fire_time + jitter_offset(plan.name, fire_time, plan.jitter)


@dataclass(frozen=True, slots=True)
class Minute:
    """The firings of one minute: how many, the most at one instant, and which tasks."""

    start: datetime
    count: int
    #: The most firings at one instant of the minute, and that instant.
    together: int
    instant: datetime
    names: list[str]


def busiest_minutes(firings: Sequence[Firing], *, limit: int = 50) -> tuple[list[Minute], int]:
    """Return the *limit* minutes of *firings* with the most firings (ties: the earlier), in
    time order, and how many minutes have firings."""
    minutes: dict[datetime, list[Firing]] = {}
    for firing in firings:
        minutes.setdefault(firing.at.replace(second=0, microsecond=0), []).append(firing)
    busiest = sorted(minutes.items(), key=lambda item: (-len(item[1]), item[0]))[:limit]
    chosen = []
    for start, group in sorted(busiest, key=lambda item: item[0]):
        instants: dict[datetime, int] = {}
        for firing in group:
            instants[firing.at] = instants.get(firing.at, 0) + 1
        instant, together = max(instants.items(), key=lambda item: (item[1], -item[0].timestamp()))
        names = sorted({firing.name for firing in group})
        chosen.append(Minute(start, len(group), together, instant, names))
    return chosen, len(minutes)
