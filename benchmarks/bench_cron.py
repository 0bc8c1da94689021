"""
Time CronExpression.next() against croniter on a mix of expressions.

Usage: python benchmarks/bench_cron.py [--quick] [--output PATH]

Each expression is timed as a chain of next() calls (every result feeds the next call), the chain
restarting from the same start every CHAIN calls so that sparse expressions stay in a realistic
range of years. Both libraries parse once and then only compute: ours calls next(previous),
croniter reuses one iterator (get_next(), set_current() to restart). Repetitions are interleaved
(ours, croniter, ours, ...) so that machine noise hits both alike; the median is reported.
croniter is run with day_or=False (AND of the day fields, as in Spring) for six-field expressions
and with its default day_or=True (cron's rule) for five-field lines. Its six-field form puts the
seconds last, so expressions are converted; an expression croniter rejects, or whose first
results differ from ours, is not compared, and the table says why.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_scheduling.schedules.cron import CronExpression

try:
    from croniter import croniter
except ImportError:  # pragma: no cover - croniter is in the "bench" extra
    croniter = None

EXPRESSIONS = [
    ("every second", "* * * * * *"),
    ("every 5 seconds", "*/5 * * * * *"),
    ("every 15 minutes", "0 */15 * * * *"),
    ("hourly", "0 0 * * * *"),
    ("daily 09:30", "0 30 9 * * *"),
    ("weekly, Sunday", "0 0 0 * * SUN"),
    ("weekdays at noon", "0 0 12 ? * MON-FRI"),
    ("last day of month", "0 0 0 L * *"),
    ("last weekday of month", "0 0 0 LW * *"),
    ("Feb 29", "0 0 0 29 2 *"),
    ("3rd Saturday 10:15", "0 15 10 ? * 6#3"),
    ("Friday the 13th", "0 0 0 13 * FRI"),
    ("5 fields: every 10 minutes", "*/10 * * * *"),
    ("5 fields: weekdays 08:30", "30 8 * * 1-5"),
    ("5 fields: 13th or Friday", "0 0 13 * 5"),
]
START = datetime(2024, 1, 1, 12, 0, 0, 123_456)
BERLIN = ZoneInfo("Europe/Berlin")
CHAIN = 50
RESULT = Path(__file__).resolve().parent / "results" / "cron.md"


def to_croniter(expression: str) -> str:
    """Convert to croniter's syntax: five fields as they are, six with the seconds last."""
    fields = expression.replace("?", "*").split()
    if len(fields) == 6:
        fields = fields[1:] + fields[:1]
    return " ".join(fields)


def ours_runner(expression: str, start: datetime) -> Callable[[int], None]:
    cron = CronExpression.parse(expression)

    def run(calls: int) -> None:
        current = start
        for index in range(calls):
            current = cron.next(start if index % CHAIN == 0 else current)

    return run


def croniter_runner(expression: str) -> tuple[Callable[[int], None] | None, str]:
    """Return a runner for croniter, or None and the reason it cannot be compared."""
    if croniter is None:
        return None, "croniter is not installed"
    converted = to_croniter(expression)
    try:
        # Five fields: cron's rule, a day matching either restricted day field fires.
        day_or = len(expression.split()) == 5
        iterator = croniter(converted, START, day_or=day_or)
        theirs = [iterator.get_next(datetime) for _ in range(20)]
    except Exception as exc:  # croniter raises its own errors for syntax it lacks
        return None, f"croniter rejects {converted!r} ({type(exc).__name__})"
    cron = CronExpression.parse(expression)
    ours, current = [], START
    for _ in range(20):
        current = cron.next(current)
        ours.append(current)
    if theirs != ours:
        return None, f"croniter gives different times for {converted!r}"

    def run(calls: int) -> None:
        for index in range(calls):
            if index % CHAIN == 0:
                iterator.set_current(START, force=True)
            iterator.get_next(datetime)

    return run, ""


def per_call(run: Callable[[int], None], calls: int) -> float:
    """Return the seconds per call of one timed batch."""
    gc.disable()
    try:
        started = time.perf_counter()
        run(calls)
        return (time.perf_counter() - started) / calls
    finally:
        gc.enable()


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        theirs = f"croniter {version('croniter')}"
    except PackageNotFoundError:
        theirs = "croniter not installed"
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {platform.platform()}, "
        f"Python {platform.python_version()}, {theirs}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (< 10 s)")
    parser.add_argument("--output", type=Path, default=RESULT, help=f"default: {RESULT}")
    options = parser.parse_args()
    reps, ours_calls, their_calls = (3, 1000, 100) if options.quick else (11, 10_000, 1_000)

    rows = []
    ratios = []
    for label, expression in EXPRESSIONS:
        naive = ours_runner(expression, START)
        zoned = ours_runner(expression, START.replace(tzinfo=BERLIN))
        theirs, why_not = croniter_runner(expression)
        times: dict[str, list[float]] = {"naive": [], "zoned": [], "croniter": []}
        for _ in range(reps):
            times["naive"].append(per_call(naive, ours_calls))
            if theirs is not None:
                times["croniter"].append(per_call(theirs, their_calls))
            times["zoned"].append(per_call(zoned, ours_calls))
        ours = statistics.median(times["naive"]) * 1e6
        ours_zoned = statistics.median(times["zoned"]) * 1e6
        if theirs is not None:
            their_time = statistics.median(times["croniter"]) * 1e6
            ratios.append(their_time / ours)
            compared = f"{their_time:.1f} | {1e6 / their_time:,.0f} | {their_time / ours:.1f}x"
        else:
            compared = f"n/a | n/a | {why_not}"
        rows.append(
            f"| {label} | `{expression}` | {ours:.2f} | {1e6 / ours:,.0f} | {ours_zoned:.2f} "
            f"| {compared} |"
        )
        print(rows[-1], flush=True)

    median_ratio = statistics.median(ratios) if ratios else float("nan")
    summary = (
        f"Median speed-up over croniter: {median_ratio:.1f}x "
        f"({len(ratios)} of {len(EXPRESSIONS)} expressions compared)."
    )
    print(summary)
    now = datetime.now().astimezone().isoformat(timespec="seconds")
    mode = "quick" if options.quick else "full"
    report = [
        "# Cron next() benchmark",
        "",
        f"Run {now} ({mode}: {reps} interleaved repetitions of {ours_calls:,} calls for ours, "
        f"{their_calls:,} for croniter; median shown). Machine: {machine()}.",
        "",
        f"Chains of next() from {START.isoformat()}, restarting every {CHAIN} calls. "
        "'aware' chains the same expression from an Europe/Berlin datetime. croniter runs with "
        "day_or=False (AND of the day fields, as in Spring) for six fields and day_or=True (cron's "
        "rule) for five, and reuses one iterator.",
        "",
        "| expression | | ours µs/call | ours calls/s | ours aware µs/call "
        "| croniter µs/call | croniter calls/s | speed-up |",
        "|---|---|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
        summary,
        "",
    ]
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text("\n".join(report))
    print(f"Wrote {options.output}")


if __name__ == "__main__":
    main()
