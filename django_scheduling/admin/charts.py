"""Charts of the admin pages as inline SVG, drawn on the server: no JavaScript, and every text
(task names, statuses, times) escaped. Each mark has a ``<title>``: the browser shows it on
hover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from ..formats import format_time
from ..models import RunStatus
from ..schedules.timeline import Timeline
from .trends import CHART_RUNS, FAILURES, RunPoint
from .views import format_run_duration

__all__ = ["STATUS_COLOURS", "status_label", "run_chart", "sparkline", "timeline_strip"]

#: The fill of each run status; an unknown status is grey.
STATUS_COLOURS = {
    RunStatus.SUCCEEDED.value: "#16a34a",
    RunStatus.FAILED.value: "#dc2626",
    RunStatus.LOST.value: "#7f1d1d",
    RunStatus.TIMED_OUT.value: "#be185d",
    RunStatus.INTERRUPTED.value: "#f59e0b",
    RunStatus.REJECTED.value: "#ea580c",
    RunStatus.RUNNING.value: "#2563eb",
    RunStatus.ENQUEUED.value: "#94a3b8",
}
OTHER_COLOUR = "#6b7280"
LATE_COLOUR = "#7c3aed"
_LABELS = dict(RunStatus.choices)


def status_label(status: str) -> str:
    """Return the label of run status *status*; an unknown status is shown as it is."""
    return str(_LABELS.get(status, status))


def _clock(moment: datetime) -> str:
    """Return *moment*'s hour and minute in the current time zone."""
    return dateformat.format(timezone.localtime(moment), "H:i")


def _run_title(point: RunPoint) -> str:
    parts = [
        _("run %(id)s") % {"id": point.id},
        status_label(point.status),
        format_time(point.started_at),
        format_run_duration(point.duration) if point.duration is not None else _("no duration"),
    ]
    if point.late and point.lateness is not None:
        parts.append(_("started %(late)s late") % {"late": format_run_duration(point.lateness)})
    return " · ".join(parts)


# The chart on a task's page, in SVG user units.
_WIDTH, _HEIGHT = 1000, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 8, 18, 26


def run_chart(points: Sequence[RunPoint], *, slots: int = CHART_RUNS) -> SafeString:
    """Return the chart of *points* (oldest first): one bar per run, its height the run's
    duration and its colour the outcome, newest on the right; a mark above the late starts.
    A failure without a duration (a lost run) reaches the top: it must not be missed.

    The scale is the longest ended run: a run still in progress longer than that reaches the
    top, and its tooltip says how long it has run.
    """
    plot_width = _WIDTH - _LEFT - _RIGHT
    plot_height = _HEIGHT - _TOP - _BOTTOM
    slot = plot_width / max(slots, len(points), 1)
    measured = [p for p in points if p.duration is not None]
    ended = [p for p in measured if not p.in_progress] or measured
    longest = max((p.duration for p in ended if p.duration is not None), default=None)
    scale = longest.total_seconds() if longest else 0.0
    offset = _LEFT + plot_width - slot * len(points)
    bars, marks = [], []
    for index, point in enumerate(points):
        if point.duration is None and point.status in FAILURES:
            height = float(plot_height)  # lost: how long it ran is unknown, its failure is not
        else:
            seconds = point.duration.total_seconds() if point.duration is not None else 0.0
            height = max(min(plot_height * seconds / scale, plot_height) if scale else 0.0, 2.0)
        x = offset + index * slot
        y = _TOP + plot_height - height
        bars.append(
            (
                point.status,
                STATUS_COLOURS.get(point.status, OTHER_COLOUR),
                f"{x + slot * 0.1:.1f}",
                f"{y:.1f}",
                f"{slot * 0.8:.1f}",
                f"{height:.1f}",
                _run_title(point),
            )
        )
        if point.late:
            centre, top = x + slot / 2, y - 3
            corners = f"{centre - 4:.1f},{top - 8:.1f} {centre + 4:.1f},{top - 8:.1f} "
            corners += f"{centre:.1f},{top:.1f}"
            marks.append((LATE_COLOUR, corners, _run_title(point)))
    first = format_time(points[0].started_at) if points else ""
    last = format_time(points[-1].started_at) if points else ""
    axis_y = _TOP + plot_height
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="ds-chart" id="ds-run-chart" '
        'viewBox="0 0 {} {}" role="img" aria-labelledby="ds-run-chart-title">'
        '<title id="ds-run-chart-title">{}</title>'
        '<g class="ds-axis" fill="currentColor" font-size="12">'
        '<text x="{}" y="{}" text-anchor="end">{}</text>'
        '<text x="{}" y="{}" text-anchor="end">0</text>'
        '<text x="{}" y="{}">{}</text>'
        '<text x="{}" y="{}" text-anchor="end">{}</text></g>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="0.3"/>'
        "{}{}</svg>",
        _WIDTH,
        _HEIGHT,
        ngettext(
            "Duration of the last run, coloured by outcome",
            "Durations of the last %(count)d runs, coloured by outcome",
            len(points),
        )
        % {"count": len(points)},
        _LEFT - 6,
        _TOP + 10,
        format_run_duration(longest) if longest else "",
        _LEFT - 6,
        axis_y,
        _LEFT,  # the times at the ends of the axis: they never overlap
        _HEIGHT - 6,
        first,
        _WIDTH - _RIGHT,
        _HEIGHT - 6,
        last,
        _LEFT,
        axis_y,
        _WIDTH - _RIGHT,
        axis_y,
        format_html_join(
            "",
            '<rect class="ds-bar" data-status="{}" fill="{}" x="{}" y="{}" width="{}" '
            'height="{}"><title>{}</title></rect>',
            bars,
        ),
        format_html_join(
            "", '<polygon class="ds-late" fill="{}" points="{}"><title>{}</title></polygon>', marks
        ),
    )


def sparkline(points: Sequence[RunPoint], *, slots: int) -> SafeString:
    """Return one tick per run of *points* (oldest first), coloured by outcome, newest on the
    right; a failed, timed-out or lost run's tick is taller."""
    tick, gap, height = 2, 1, 10
    width = slots * (tick + gap)
    offset = width - len(points) * (tick + gap)
    counts: dict[str, int] = {}
    ticks = []
    for index, point in enumerate(points):
        counts[point.status] = counts.get(point.status, 0) + 1
        tall = point.status in FAILURES
        top = 0 if tall else 3
        ticks.append(
            (
                point.status,
                STATUS_COLOURS.get(point.status, OTHER_COLOUR),
                offset + index * (tick + gap),
                top,
                tick,
                height - top,
                _run_title(point),
            )
        )
    summary = ", ".join(f"{count} {status_label(status)}" for status, count in counts.items())
    title = _("Last %(count)d runs: %(summary)s") % {"count": len(points), "summary": summary}
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="ds-sparkline" width="{}" height="{}" '
        'viewBox="0 0 {} {}" role="img"><title>{}</title>{}</svg>',
        width,
        height,
        width,
        height,
        title,
        format_html_join(
            "",
            '<rect class="ds-tick" data-status="{}" fill="{}" x="{}" y="{}" width="{}" '
            'height="{}"><title>{}</title></rect>',
            ticks,
        ),
    )


#: The timeline strip: one bar per this much time.
BIN = timedelta(minutes=10)
BUSY_COLOUR = "#2563eb"
COLLISION_COLOUR = "#ea580c"


def timeline_strip(timeline: Timeline, *, step: timedelta = BIN) -> SafeString:
    """Return the firings of *timeline* as bars of *step* each, their height the number of
    firings; a bar where several tasks fire at the same instant is orange.

    The bars start on the clock (10:20, not 10:23:41) in the current time zone; *step* divides
    an hour."""
    local = timezone.localtime(timeline.start)
    origin = local.replace(second=0, microsecond=0) - timedelta(
        minutes=local.minute % (step // timedelta(minutes=1))
    )
    origin = origin.astimezone(UTC)  # steps of real time, across a change of the clocks
    bins = max(math.ceil((timeline.shown_until - origin) / step), 1)
    counts = [0] * bins
    instants: list[dict[object, int]] = [{} for _ in range(bins)]
    for firing in timeline.firings:
        index = min(int((firing.at - origin) / step), bins - 1)
        counts[index] += 1
        instants[index][firing.at] = instants[index].get(firing.at, 0) + 1
    width, height, top, bottom, left = 1000, 150, 10, 22, 40
    plot_height = height - top - bottom
    slot = (width - left) / bins
    most = max(counts, default=0)
    bars = []
    for index, count in enumerate(counts):
        if not count:
            continue
        start = origin + index * step
        together = max(instants[index].values())
        bar_height = max(plot_height * count / most, 2.0)
        title = ngettext(
            "%(start)s to %(end)s: %(count)d firing",
            "%(start)s to %(end)s: %(count)d firings",
            count,
        ) % {"start": format_time(start), "end": format_time(start + step), "count": count}
        if together > 1:
            title += "; " + _("%(together)d tasks at one instant") % {"together": together}
        bars.append(
            (
                "ds-slot ds-slot--collision" if together > 1 else "ds-slot",
                count,
                COLLISION_COLOUR if together > 1 else BUSY_COLOUR,
                f"{left + index * slot + 0.5:.1f}",
                f"{top + plot_height - bar_height:.1f}",
                f"{max(slot - 1, 1):.1f}",
                f"{bar_height:.1f}",
                title,
            )
        )
    # A label every three hours of the clock (every hour over a shorter span, every bar over
    # less than three hours), at the bar that starts then.
    every = 180 if bins > 72 else 60 if bins > 18 else step // timedelta(minutes=1)
    labels = []
    for index in range(bins):
        moment = timezone.localtime(origin + index * step)
        if (moment.hour * 60 + moment.minute) % every == 0:
            labels.append((f"{left + index * slot:.1f}", height - 6, _clock(moment)))
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="ds-chart" id="ds-timeline-strip" '
        'viewBox="0 0 {} {}" role="img"><title>{}</title>'
        '<g fill="currentColor" font-size="12">'
        '<text x="{}" y="{}" text-anchor="end">{}</text>{}</g>{}</svg>',
        width,
        height,
        _("Firings per %(minutes)d minutes") % {"minutes": step // timedelta(minutes=1)},
        left - 6,
        top + 10,
        most,
        format_html_join("", '<text x="{}" y="{}" text-anchor="middle">{}</text>', labels),
        format_html_join(
            "",
            '<rect class="{}" data-count="{}" fill="{}" x="{}" y="{}" width="{}" height="{}">'
            "<title>{}</title></rect>",
            bars,
        ),
    )
