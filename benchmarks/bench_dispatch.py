"""Dispatch lateness, missed firings, CPU and memory per task: our Scheduler vs APScheduler 3.

Every task is due every second on a grid that the harness sets: ``intended = anchor + k * 1 s``.
With the "aligned" layout all tasks share one anchor (a burst of N firings each second); with
"spread" each task's anchor has its own random offset in [0, 1) s. Each task records
``time.time()`` when its function starts; the harness matches each start to the latest grid slot
at or before it and measures:

- lateness = start minus intended time (p50 / p99 / max over every run in the window);
- missed = slots in the window with no run, duplicate = extra runs matched to a taken slot;
- CPU time of the process during the window as % of one core;
- RSS growth from adding the tasks, divided by the number of tasks.

Each measurement runs in a fresh subprocess (``--worker``), so that RSS figures are comparable;
the driver runs them one after the other and writes ``benchmarks/results/dispatch.md`` and
``dispatch.json``::

    python benchmarks/bench_dispatch.py            # full run, about 10 minutes on 2 cores
    python benchmarks/bench_dispatch.py --quick    # smoke check, 2 minutes; prints, writes nothing
    python benchmarks/bench_dispatch.py --worker ours --tasks 1000 --layout spread --seconds 20
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"

SCHEDULERS = ("ours", "apscheduler")
LAYOUTS = ("aligned", "spread")
FULL_TASKS = (10, 100, 1_000, 10_000)
QUICK_TASKS = (10, 100, 1_000)
#: Configurations with at least this many tasks are run ``--repeats`` times in a full run.
REPEAT_FROM = 10_000
WORKERS = 10
PERIOD = 1.0  # seconds between a task's firings
SEED = 20_251_121
#: How long the worker waits after the window for late runs of window slots to start. APScheduler
#: never starts a run more than misfire_grace_time (1 s) late; ours never drops one.
DRAIN = {"ours": 10.0, "apscheduler": 1.5}

_time = time.time


def record(starts: list[float]) -> None:
    """The task body, the same for both schedulers: note when it started."""
    starts.append(_time())


# -- measurement helpers -----------------------------------------------------------------------


def rss_bytes() -> int:
    """Return the resident set size of this process."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def percentile(ordered: Sequence[float], q: float) -> float:
    """Return the nearest-rank *q*-quantile (0 < q <= 1) of the sorted values."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def sleep_until(moment: float) -> None:
    while (left := moment - _time()) > 0:
        time.sleep(left)


def anchor_offsets(tasks: int, layout: str, seed: int) -> list[int]:
    """Return each task's anchor offset in whole microseconds, so both schedulers get it exactly."""
    if layout == "aligned":
        return [0] * tasks
    rng = random.Random(seed)
    return [rng.randrange(1_000_000) for _ in range(tasks)]


def to_datetime(microseconds: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=microseconds)


@dataclass
class Outcome:
    """What the harness saw of one run's window."""

    expected: int = 0
    executed: int = 0  # runs matched to a slot of the window
    missed: int = 0
    duplicate: int = 0
    early: int = 0  # runs that started before the task's anchor (should never happen)
    lateness_ms: dict[str, float] = field(default_factory=dict)


def analyse(
    anchors: Sequence[float], starts: Sequence[Sequence[float]], first: int, slots: int
) -> Outcome:
    """Match each start to the latest slot ``anchor + k * PERIOD`` at or before it and count the
    window's slots ``first <= k < first + slots``.

    A run more than one period late therefore counts for a later slot; it shows up as a missed
    and a duplicate slot, never as a smaller lateness alone.
    """
    outcome = Outcome(expected=len(anchors) * slots)
    lateness: list[float] = []
    for anchor, runs in zip(anchors, starts, strict=True):
        taken = bytearray(slots)
        for start in runs:
            k = math.floor((start - anchor) / PERIOD)
            if k < 0:
                outcome.early += 1
                continue
            index = k - first
            if not 0 <= index < slots:
                continue
            if taken[index]:
                outcome.duplicate += 1
                continue
            taken[index] = 1
            lateness.append(start - (anchor + k * PERIOD))
        outcome.executed += sum(taken)
    outcome.missed = outcome.expected - outcome.executed
    lateness.sort()
    outcome.lateness_ms = {
        "p50": percentile(lateness, 0.50) * 1e3,
        "p99": percentile(lateness, 0.99) * 1e3,
        "max": (lateness[-1] if lateness else math.nan) * 1e3,
        "mean": (statistics.fmean(lateness) if lateness else math.nan) * 1e3,
    }
    return outcome


# -- the two schedulers under test -------------------------------------------------------------


class Harness:
    """One scheduler with N recording tasks; ``add`` and ``stop`` are what is timed and measured."""

    settings: dict[str, Any]

    def add(self, funcs: Sequence[Callable[[], None]], anchors_us: Sequence[int]) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def diagnostics(
        self, anchors: Sequence[float], starts: Sequence[Sequence[float]], first: int, slots: int
    ) -> dict:
        return {}


class OursHarness(Harness):
    """django_scheduling's Scheduler with a minimal in-memory Runner and FixedRateTrigger."""

    def __init__(self, tasks: int) -> None:
        from django_scheduling.runtime.scheduler import Scheduler

        self.runner = _make_memory_runner()
        # Harness-only lists, made before the RSS baseline like the tasks' own lists.
        self.fire_times: list[list[datetime]] = [[] for _ in range(tasks)]
        self.scheduler = Scheduler(
            self.runner,
            core_pool_size=WORKERS,
            max_pool_size=WORKERS,
            queue_capacity=max(2 * tasks, 1),
        )
        self.settings = {
            "core_pool_size": WORKERS,
            "max_pool_size": WORKERS,
            "queue_capacity": max(2 * tasks, 1),
            "trigger": "FixedRateTrigger(period=1s), anchor set by the harness",
            "missed": "coalesce (default): a run that ends after the task's next slot is "
            "followed at once by one run for the newest slot due",
            "module": _module_origin("django_scheduling"),
        }
        self.scheduler.start()

    def add(self, funcs: Sequence[Callable[[], None]], anchors_us: Sequence[int]) -> None:
        from django_scheduling.runtime.scheduler import Entry
        from django_scheduling.schedules.triggers import FixedRateTrigger, TriggerState

        self.tasks = []
        for index, (func, anchor) in enumerate(zip(funcs, anchors_us, strict=True)):
            task = _MemoryTask(
                FixedRateTrigger(timedelta(seconds=PERIOD)),
                TriggerState(anchor=to_datetime(anchor)),
                func,
                self.fire_times[index],
            )
            self.tasks.append(task)
            self.scheduler.add(Entry(f"task-{index}", task))

    def stop(self) -> None:
        self.scheduler.shutdown(timeout=10)

    def diagnostics(
        self, anchors: Sequence[float], starts: Sequence[Sequence[float]], first: int, slots: int
    ) -> dict:
        """Cross-check the harness's matching of runs to slots, over the window's runs, with the
        fire time that our scheduler passed to each run (APScheduler does not tell its jobs)."""
        mismatched, worst = 0, 0.0
        for task, anchor, runs in zip(self.tasks, anchors, starts, strict=True):
            for fire_time, start in zip(task.fire_times, runs, strict=False):
                ours = round((fire_time.timestamp() - anchor) / PERIOD)
                if not first <= ours < first + slots:
                    continue
                if ours != math.floor((start - anchor) / PERIOD):
                    mismatched += 1
                worst = max(worst, start - fire_time.timestamp())
        return {
            "slot_mismatches_vs_scheduler_fire_time": mismatched,
            "max_lateness_vs_scheduler_fire_time_ms": worst * 1e3,
            "rejections": self.runner.rejections,
        }


@dataclass(eq=False, slots=True)
class _MemoryTask:
    """What the runner keeps of a task (execution.TaskSpec's counterpart, minus the database)."""

    trigger: Any
    state: Any
    action: Callable[[], None]
    fire_times: list[datetime]


def _make_memory_runner() -> Any:
    """Return a Runner that keeps each task's TriggerState in memory, like a task with lock=False
    but without its database row: the Scheduler core alone is measured."""
    from django_scheduling.schedules.triggers import TriggerState

    def now() -> datetime:
        return datetime.now(UTC)

    class MemoryRunner:
        rejections = 0

        def first_fire_time(self, entry: Any, *, now: datetime) -> datetime | None:
            task: _MemoryTask = entry.payload
            return task.trigger.next_fire_time(now=now, state=task.state)

        def run(self, entry: Any, fire_time: datetime | None) -> datetime | None:
            task: _MemoryTask = entry.payload
            task.action()
            finished = now()
            task.fire_times.append(fire_time)  # for the cross-check in diagnostics() only
            task.state = TriggerState(task.state.anchor, fire_time, finished)
            return task.trigger.next_fire_time(now=finished, state=task.state)

        def rejected(self, entry: Any, fire_time: datetime | None, stats: Any) -> None:
            MemoryRunner.rejections += 1

        def next_after_rejection(self, entry: Any, fire_time: datetime | None) -> datetime | None:
            task: _MemoryTask = entry.payload
            task.state = TriggerState(task.state.anchor, fire_time, task.state.last_finished)
            return task.trigger.next_fire_time(now=now(), state=task.state)

    return MemoryRunner()


class APSchedulerHarness(Harness):
    """APScheduler 3's BackgroundScheduler: MemoryJobStore, ThreadPoolExecutor(10), defaults."""

    def __init__(self, tasks: int) -> None:
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler

        self.scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(WORKERS)}, timezone=UTC
        )
        defaults = self.scheduler._job_defaults
        self.settings = {
            "executor": f"ThreadPoolExecutor({WORKERS})",
            "jobstore": "MemoryJobStore (default)",
            "trigger": "IntervalTrigger(seconds=1, start_date=anchor)",
            "misfire_grace_time_s": defaults["misfire_grace_time"],
            "coalesce": defaults["coalesce"],
            "max_instances": defaults["max_instances"],
            "module": _module_origin("apscheduler"),
        }
        self.scheduler.start()

    def add(self, funcs: Sequence[Callable[[], None]], anchors_us: Sequence[int]) -> None:
        from apscheduler.triggers.interval import IntervalTrigger

        for index, (func, anchor) in enumerate(zip(funcs, anchors_us, strict=True)):
            trigger = IntervalTrigger(seconds=PERIOD, start_date=to_datetime(anchor), timezone=UTC)
            self.scheduler.add_job(func, trigger, id=f"task-{index}")

    def stop(self) -> None:
        self.scheduler.shutdown(wait=True)


def _module_origin(name: str) -> str:
    module = sys.modules[name]
    return str(Path(module.__file__ or "?").parent)


# -- one measurement (the --worker subprocess) -------------------------------------------------


def run_worker(
    scheduler: str, tasks: int, layout: str, seconds: int, warmup: int, seed: int
) -> dict:
    offsets = anchor_offsets(tasks, layout, seed)
    starts: list[list[float]] = [[] for _ in range(tasks)]
    funcs = [partial(record, runs) for runs in starts]
    harness: Harness = OursHarness(tasks) if scheduler == "ours" else APSchedulerHarness(tasks)

    gc.collect()
    rss_before = rss_bytes()
    # Leave time to add every task before the first firing (APScheduler: ~50-100 us a job).
    base = math.ceil(_time() + 0.5 + tasks * 100e-6)
    anchors_us = [base * 1_000_000 + offset for offset in offsets]
    added = time.perf_counter()
    harness.add(funcs, anchors_us)
    add_seconds = time.perf_counter() - added
    add_finished_before_first_firing = _time() < base
    gc.collect()
    rss_after_add = rss_bytes()

    window_start = base + warmup
    window_end = window_start + seconds
    sleep_until(window_start)
    usage_start, wall_start = resource.getrusage(resource.RUSAGE_SELF), _time()
    sleep_until(window_end)
    usage_end, wall_seconds = resource.getrusage(resource.RUSAGE_SELF), _time() - wall_start
    user = usage_end.ru_utime - usage_start.ru_utime
    system = usage_end.ru_stime - usage_start.ru_stime
    switches = usage_end.ru_nvcsw - usage_start.ru_nvcsw
    preempted = usage_end.ru_nivcsw - usage_start.ru_nivcsw

    anchors = [anchor / 1e6 for anchor in anchors_us]
    last_slots = [anchor + (warmup + seconds - 1) * PERIOD for anchor in anchors]
    drain_deadline = window_end + DRAIN[scheduler]
    while _time() < drain_deadline:
        if all(runs and runs[-1] >= last for runs, last in zip(starts, last_slots, strict=True)):
            break
        time.sleep(0.1)
    rss_end = rss_bytes()
    load_average = os.getloadavg()
    harness.stop()

    snapshot = [list(runs) for runs in starts]
    outcome = analyse(anchors, snapshot, first=warmup, slots=seconds)
    return {
        "scheduler": scheduler,
        "tasks": tasks,
        "layout": layout,
        "seconds": seconds,
        "warmup": warmup,
        "seed": seed,
        "workers": WORKERS,
        "settings": harness.settings,
        **asdict(outcome),
        "cpu_percent": 100.0 * (user + system) / wall_seconds,
        "cpu_user_percent": 100.0 * user / wall_seconds,
        "cpu_system_percent": 100.0 * system / wall_seconds,
        "cpu_us_per_firing": (user + system) / max(outcome.executed, 1) * 1e6,
        "context_switches_per_firing": {
            "voluntary": switches / max(outcome.executed, 1),
            "involuntary": preempted / max(outcome.executed, 1),
        },
        "rss_before_add": rss_before,
        "rss_after_add": rss_after_add,
        "rss_at_end": rss_end,
        "memory_per_task": (rss_after_add - rss_before) / tasks,
        "add_us_per_task": add_seconds / tasks * 1e6,
        "add_finished_before_first_firing": add_finished_before_first_firing,
        "load_average_at_end": load_average,
        "diagnostics": harness.diagnostics(anchors, snapshot, warmup, seconds),
    }


# -- the driver --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    scheduler: str
    tasks: int
    layout: str


def plan(task_counts: Iterable[int], repeats: int) -> list[Config]:
    """Return the runs in order: every configuration once, then the big ones again.

    The two schedulers alternate within a configuration, and swap order on each repetition, so
    that they share the machine's noise.
    """
    runs: list[Config] = []
    counts = list(task_counts)
    for repetition in range(repeats):
        order = SCHEDULERS if repetition % 2 == 0 else tuple(reversed(SCHEDULERS))
        for tasks in counts:
            if repetition and tasks < REPEAT_FROM:
                continue
            for layout in LAYOUTS:
                runs.extend(Config(name, tasks, layout) for name in order)
    return runs


def spawn(config: Config, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        config.scheduler,
        "--tasks",
        str(config.tasks),
        "--layout",
        config.layout,
        "--seconds",
        str(args.seconds),
        "--warmup",
        str(args.warmup),
        "--seed",
        str(args.seed),
    ]
    if args.ours_path:
        command += ["--ours-path", args.ours_path]
    budget = args.warmup + args.seconds + config.tasks * 1e-3 + 60
    with tempfile.TemporaryFile("w+") as stderr:
        done = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=budget, check=False
        )
        stderr.seek(0)
        log = stderr.read()
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"worker {config} failed ({done.returncode}):\n{log[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # APScheduler logs a warning per dropped run; count them as its own view of what it missed.
    result["stderr_lines"] = log.count("\n")
    result["stderr_missed_warnings"] = log.count("was missed by")
    result["stderr_max_instances_warnings"] = log.count("maximum number of running instances")
    return result


def summarise(results: list[dict]) -> list[dict]:
    """Return one row per configuration: medians over its repetitions."""
    rows: list[dict] = []
    groups: dict[Config, list[dict]] = {}
    for result in results:
        key = Config(result["scheduler"], result["tasks"], result["layout"])
        groups.setdefault(key, []).append(result)
    order = {name: index for index, name in enumerate(SCHEDULERS)}
    for key in sorted(groups, key=lambda c: (c.tasks, LAYOUTS.index(c.layout), order[c.scheduler])):
        runs = groups[key]

        def median(pick: Callable[[dict], float], runs: list[dict] = runs) -> float:
            return statistics.median(pick(run) for run in runs)

        rows.append(
            {
                **asdict(key),
                "runs": len(runs),
                "p50_ms": median(lambda r: r["lateness_ms"]["p50"]),
                "p99_ms": median(lambda r: r["lateness_ms"]["p99"]),
                "max_ms": median(lambda r: r["lateness_ms"]["max"]),
                "expected": runs[0]["expected"],
                "missed": median(lambda r: r["missed"]),
                "missed_each": [r["missed"] for r in runs],
                "duplicate": median(lambda r: r["duplicate"]),
                "cpu_percent": median(lambda r: r["cpu_percent"]),
                "memory_per_task": median(lambda r: r["memory_per_task"]),
                "cpu_us_per_firing": median(lambda r: r["cpu_us_per_firing"]),
                "load": median(lambda r: r["load_average_at_end"][0]),
            }
        )
    return rows


def fmt_ms(value: float) -> str:
    if math.isnan(value):
        return "—"
    if value < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def fmt_missed(row: dict) -> str:
    missed, expected = row["missed"], row["expected"]
    text = "0" if missed == 0 else f"{missed:,.0f} ({100 * missed / expected:.1f} %)"
    if row["runs"] > 1 and any(row["missed_each"]):
        text += " [" + " / ".join(f"{m:,}" for m in row["missed_each"]) + "]"
    return text


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| scheduler | tasks | layout | runs | p50 (ms) | p99 (ms) | max (ms) | missed "
        "| duplicate | CPU % | memory/task (bytes) | load |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        memory = f"{row['memory_per_task']:,.0f}" if row["tasks"] >= 1_000 else "—"
        lines.append(
            f"| {row['scheduler']} | {row['tasks']:,} | {row['layout']} | {row['runs']} "
            f"| {fmt_ms(row['p50_ms'])} | {fmt_ms(row['p99_ms'])} | {fmt_ms(row['max_ms'])} "
            f"| {fmt_missed(row)} | {row['duplicate']:,.0f} | {row['cpu_percent']:.1f} "
            f"| {memory} | {row['load']:.1f} |"
        )
    return "\n".join(lines)


def machine(package_root: Path) -> dict:
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    sources = ("scheduler.py", "pool.py", "triggers.py")
    digest = hashlib.sha256()
    for name in sources:
        digest.update((package_root / "django_scheduling" / name).read_bytes())
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "python": platform.python_version(),
        "apscheduler": metadata.version("apscheduler"),
        "django": metadata.version("django"),
        "load_average_at_start": os.getloadavg(),
        "django_scheduling_sources_sha256": f"{'+'.join(sources)}: {digest.hexdigest()[:12]}",
    }


def write_results(
    info: dict, results: list[dict], rows: list[dict], command: str, minutes: float
) -> str:
    aps = next((r["settings"] for r in results if r["scheduler"] == "apscheduler"), {})
    ours = next((r["settings"] for r in results if r["scheduler"] == "ours"), {})
    seconds, warmup = results[0]["seconds"], results[0]["warmup"]
    repeated = ", ".join(f"{t:,}" for t in sorted({r["tasks"] for r in rows if r["runs"] > 1}))
    load = ", ".join(f"{x:.2f}" for x in info["load_average_at_start"])
    method = (
        "Every task is due every 1 s on a grid set by the harness (`anchor + k * 1 s`; *aligned*: "
        "one anchor for all tasks, *spread*: a random offset in [0, 1) s per task), and its "
        "function only appends `time.time()` to a list. **Lateness** = that start time minus the "
        "intended time computed by the harness (never taken from the scheduler), each start "
        "being matched to the latest slot at or before it; p50 / p99 / max over every run of "
        f"every task in a {seconds} s window after a {warmup} s warm-up. **Missed** = slots of "
        f"the window without a run (out of tasks x {seconds}); **duplicate** = extra runs for a "
        "slot. **CPU** = the process's CPU time during the window, % of one core. "
        "**Memory/task** = RSS growth from adding the tasks to a started scheduler, / tasks "
        "(shown from 1,000 tasks: below that it is less than a page in all). **Load** = 1-minute "
        "load average at the end of the run. Each run is a fresh process; the two schedulers "
        "alternate. Rows with runs > 1 are medians, with the missed firings of each run in "
        "brackets" + (f" (repeated: {repeated} tasks)." if repeated else "; none was repeated.")
    )
    ours_text = (
        f"**ours**: `Scheduler(core_pool_size={ours.get('core_pool_size')}, "
        f"max_pool_size={ours.get('max_pool_size')}, queue_capacity=2 * tasks)`: one heap and "
        "one dispatcher thread; `FixedRateTrigger(timedelta(seconds=1))` with the harness's "
        "anchor in its `TriggerState`; an in-memory runner (no database, no lock). It never drops "
        "a firing it has dispatched; with the default `missed=coalesce`, a run that ends after "
        "the task's next slot is followed at once by one run for the newest slot due (slots "
        "skipped that way would count as missed here)."
    )
    aps_text = (
        f"**apscheduler**: `BackgroundScheduler(executors={{'default': {aps.get('executor')}}})`, "
        f"{aps.get('jobstore')}, `{aps.get('trigger')}` per job; job defaults "
        f"misfire_grace_time = {aps.get('misfire_grace_time_s')} s, "
        f"coalesce = {aps.get('coalesce')}, max_instances = {aps.get('max_instances')}: a run "
        "that cannot start within the grace time is dropped (logged as missed), and slots that "
        "passed meanwhile are coalesced into one run."
    )

    def bullet(text: str) -> str:
        return textwrap.fill(text, 100, initial_indent="- ", subsequent_indent="  ")

    lines = [
        "# Dispatch benchmark: django-scheduling `Scheduler` vs APScheduler 3",
        "",
        bullet(f"Date: {info['date']}; the run took {minutes:.1f} min."),
        bullet(
            f"Machine: {info['nproc']} CPUs (`nproc`), {info['cpu']}; load average at start "
            f"{load} (the machine is shared: see the load column)."
        ),
        bullet(
            f"Python {info['python']}, APScheduler {info['apscheduler']}, Django "
            f"{info['django']}; django_scheduling from `{ours.get('module')}` "
            f"({info['django_scheduling_sources_sha256']})."
        ),
        f"- Command: `{command}`",
        "",
        textwrap.fill(method, 100),
        "",
        f"Both schedulers have {WORKERS} worker threads.",
        "",
        bullet(ours_text),
        bullet(aps_text),
        "",
        markdown_table(rows),
        "",
        textwrap.fill(
            "Raw figures per run (CPU µs per firing, context switches, RSS, add time per task, "
            "load average): `dispatch.json`.",
            100,
        ),
        "",
    ]
    text = "\n".join(lines)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dispatch.md").write_text(text)
    payload = {"machine": info, "command": command, "summary": rows, "runs": results}
    (RESULTS / "dispatch.json").write_text(json.dumps(payload, indent=2) + "\n")
    return text


def run_driver(args: argparse.Namespace, argv: list[str]) -> None:
    counts = args.tasks_list or (QUICK_TASKS if args.quick else FULL_TASKS)
    repeats = 1 if args.quick else args.repeats
    configs = plan(counts, repeats)
    info = machine(Path(args.ours_path) if args.ours_path else REPO)
    command = " ".join(["python", "benchmarks/bench_dispatch.py", *argv])
    results: list[dict] = []
    began = time.monotonic()
    for number, config in enumerate(configs, 1):
        result = spawn(config, args)
        results.append(result)
        late = {key: fmt_ms(value) for key, value in result["lateness_ms"].items()}
        print(
            f"[{time.monotonic() - began:5.0f} s] {number}/{len(configs)} "
            f"{config.scheduler:11} {config.tasks:>6} {config.layout:7} "
            f"p50 {late['p50']} p99 {late['p99']} max {late['max']} ms, missed {result['missed']}, "
            f"dup {result['duplicate']}, CPU {result['cpu_percent']:.1f} %",
            file=sys.stderr,
            flush=True,
        )
    rows = summarise(results)
    if args.no_write or (args.quick and not args.write):
        print(markdown_table(rows))
    else:
        minutes = (time.monotonic() - began) / 60
        print(write_results(info, results, rows, command, minutes))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=SCHEDULERS, help="run one measurement (internal)")
    parser.add_argument("--tasks", type=int, default=1_000, help="tasks (with --worker)")
    parser.add_argument("--layout", choices=LAYOUTS, default="aligned", help="with --worker")
    parser.add_argument("--quick", action="store_true", help="10-1,000 tasks, 5 s windows")
    parser.add_argument("--seconds", type=int, help="measured window (default 20, quick 5)")
    parser.add_argument("--warmup", type=int, default=3, help="seconds before the window")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the 10,000-task rows")
    parser.add_argument(
        "--tasks-list", type=int, nargs="+", help="task counts to run (default 10 ... 10,000)"
    )
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the spread offsets")
    parser.add_argument(
        "--ours-path", help="directory put first on sys.path to import django_scheduling from"
    )
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument(
        "--write", action="store_true", help="with --quick: write the results files all the same"
    )
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 5 if args.quick else 20
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker is None:
        run_driver(args, argv)
        return
    sys.path.insert(0, str(REPO))
    if args.ours_path:
        sys.path.insert(0, args.ours_path)
    result = run_worker(args.worker, args.tasks, args.layout, args.seconds, args.warmup, args.seed)
    print(json.dumps(result), flush=True)
    os._exit(0)  # do not wait for lingering daemon threads or a slow interpreter teardown


if __name__ == "__main__":
    main()
