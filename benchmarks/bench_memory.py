"""Memory per task: real ``manage.py runscheduler`` processes on SQLite, and APScheduler 3.

The product as users run it: ``manage.py runscheduler`` with the settings and tasks of
``benchmarks/e2e_project`` (``SCHEDULING`` at its defaults: every task locked, history on), on
a SQLite file in WAL mode, migrated once and copied for each process. Every task is a closure
registered with ``@scheduled``, all due at the same second of the minute (cron ``S * * * * *``),
S chosen so that no task fires while the process is measured (the benchmark checks that none
ran). APScheduler 3 runs in the same run with the same jobs: ``BackgroundScheduler``,
``ThreadPoolExecutor(10)``, ``CronTrigger(second=S)``, in memory (the worker of
``bench_end_to_end.py``).

**RSS per task** = (RSS of a process with N tasks - RSS of one with 1 task) / N, read from
``/proc/<pid>/status`` a short while after the process said it runs (``--settle``), when it
has synced its tasks and sits idle.

**Where it goes**: one more pair of our processes, with ``PYTHONTRACEMALLOC=1`` (tracemalloc
from the first line, one frame) and the largest N and 1 task, each dumping a snapshot when
asked (``--traced-child`` wraps ``execute_from_command_line``, as ``manage.py`` does). Their
difference, grouped by the line that allocated and divided by N, is what each task costs in
Python objects. The rest of the RSS is mostly the allocators' slack, left by the transient
objects of the start-up (the task rows read and written when the tasks are synced), and memory
outside Python's heap (SQLite's).

    .venv/bin/python benchmarks/bench_memory.py                 # 1,000 and 10,000: about 1 min
    .venv/bin/python benchmarks/bench_memory.py --tasks 10000 --no-write --no-breakdown

Options: ``--tasks 1000,10000``, ``--systems ours,apscheduler``, ``--settle SECONDS`` (default
2), ``--no-breakdown``, ``--no-write``, ``--note TEXT`` (a line for the results header).

Figures go to ``benchmarks/results/memory.md``; logs of the last run to
``test-artifacts/bench-memory/``.
"""

from __future__ import annotations

import argparse
import gc
import linecache
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
ARTIFACTS = ROOT / "test-artifacts" / "bench-memory"
SETTINGS = "benchmarks.e2e_project.settings"
TASKS = (1_000, 10_000)
READY = {"ours": "Scheduler running", "apscheduler": "APScheduler running"}
TITLES = {"ours": "ours, `runscheduler`, SQLite", "apscheduler": "APScheduler 3, in memory"}
#: The goal of issue 11.
GOAL = 1024
#: Lines of the breakdown shown: those of at least this many bytes per task.
SHOWN_FROM = 8.0

if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench_end_to_end import Child, Failed, cleanup, migrate, read_runs  # noqa: E402


@dataclass
class Measured:
    system: str
    tasks: int
    rss: int
    startup: float


# -- children -----------------------------------------------------------------------------------


def child_env(work: Path, tasks: int, label: str, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("DJANGO_SETTINGS_MODULE", "SCHEDULING_AUTOSTART", "PYTHONTRACEMALLOC"):
        env.pop(name, None)
    env.update(
        DJANGO_SETTINGS_MODULE=SETTINGS,
        PYTHONUNBUFFERED="1",
        BENCH_TASKS=str(tasks),
        BENCH_SHAPE="minute",
        # The burst comes a minute after the launch, after the measurement.
        BENCH_MINUTE_SECOND=str(int(time.time() - 2) % 60),
        BENCH_RECORD_DIR=str(work),
        BENCH_LABEL=label,
    )
    env.update(extra)
    return env


def migrate_template(work: Path) -> Path:
    """Return a migrated SQLite file to copy for each of our processes."""
    template = work / "template.sqlite3"
    env = child_env(work, 0, "migrate", {"DATABASE_URL": f"sqlite:///{template}"})
    env["BENCH_RECORD_DIR"] = ""
    migrate(env)
    return template


def start(system: str, tasks: int, work: Path, template: Path, traced: bool = False) -> Child:
    label = f"{system}-{tasks}{'-traced' if traced else ''}"
    extra: dict[str, str] = {}
    if system == "ours":
        database = work / f"{label}.sqlite3"
        shutil.copyfile(template, database)
        extra["DATABASE_URL"] = f"sqlite:///{database}"
        if traced:
            extra.update(PYTHONTRACEMALLOC="1", BENCH_SNAPSHOT=str(work / f"{label}.snapshot"))
            args = [sys.executable, str(Path(__file__).resolve()), "--traced-child"]
        else:
            args = [sys.executable, "manage.py", "runscheduler"]
        args += ["--shutdown-timeout", "5"]
    else:
        args = [sys.executable, str(BENCH_DIR / "bench_end_to_end.py"), "--aps-worker"]
    return Child(label, args, child_env(work, tasks, label, extra), work / f"{label}.log")


def wait_ready(child: Child, system: str, tasks: int) -> None:
    deadline = time.monotonic() + 60 + tasks * 0.01
    while not child.saw(READY[system]):
        if not child.alive():
            raise Failed(f"{child.label} exited during start-up:\n{child.output_tail()}")
        if time.monotonic() > deadline:
            raise Failed(f"{child.label} did not start in time:\n{child.output_tail()}")
        time.sleep(0.05)


def stop(child: Child, work: Path) -> None:
    """Stop *child* and check that none of its tasks ran while it was measured."""
    if not child.stop(15):
        raise Failed(f"{child.label} did not exit cleanly:\n{child.output_tail()}")
    runs = read_runs(work, child.label)
    if runs:
        raise Failed(f"{child.label}: {len(runs)} task(s) ran during the measurement")


def measure(system: str, tasks: int, work: Path, template: Path, settle: float) -> Measured:
    began = time.monotonic()
    child = start(system, tasks, work, template)
    try:
        wait_ready(child, system, tasks)
        startup = time.monotonic() - began
        time.sleep(settle)
        rss = child.rss()
    finally:
        stop(child, work)
    return Measured(system, tasks, rss, startup)


# -- the traced child and its snapshots ---------------------------------------------------------


def traced_child(argv: list[str]) -> None:
    """Run ``manage.py runscheduler *argv*``; dump a tracemalloc snapshot when asked."""
    target = Path(os.environ["BENCH_SNAPSHOT"])
    request = target.with_suffix(".request")

    def serve() -> None:
        while not request.exists():
            time.sleep(0.05)
        gc.collect()
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        snapshot.dump(str(target.with_suffix(".partial")))
        target.with_suffix(".partial").rename(target)

    threading.Thread(target=serve, name="bench-snapshot", daemon=True).start()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", "runscheduler", *argv])


def traced_snapshot(tasks: int, work: Path, template: Path, settle: float) -> tracemalloc.Snapshot:
    child = start("ours", tasks, work, template, traced=True)
    target = work / f"{child.label}.snapshot"
    try:
        wait_ready(child, "ours", tasks)
        time.sleep(settle)
        target.with_suffix(".request").touch()
        deadline = time.monotonic() + 120
        while not target.exists():
            if not child.alive() or time.monotonic() > deadline:
                raise Failed(f"{child.label} wrote no snapshot:\n{child.output_tail()}")
            time.sleep(0.1)
    finally:
        stop(child, work)
    return tracemalloc.Snapshot.load(str(target))


@dataclass
class Line:
    where: str
    source: str
    size: float  # bytes per task
    count: float  # blocks per task


@dataclass
class Breakdown:
    tasks: int
    total: float  # bytes per task
    lines: list[Line]  # the lines of SHOWN_FROM bytes per task or more
    files: dict[str, float]  # bytes per task, by file


def short_path(filename: str) -> str:
    for prefix in (str(ROOT) + "/", *(p + "/" for p in sorted(sys.path, key=len)[::-1])):
        if prefix != "/" and filename.startswith(prefix):
            return filename[len(prefix) :]
    return filename


def breakdown(base: tracemalloc.Snapshot, loaded: tracemalloc.Snapshot, tasks: int) -> Breakdown:
    """Return what the process with *tasks* tasks holds more than the one with 1, per task."""
    lines = []
    files: dict[str, float] = {}
    total = 0.0
    for stat in loaded.compare_to(base, "lineno"):
        total += stat.size_diff
        frame = stat.traceback[0]
        path = short_path(frame.filename)
        files[path] = files.get(path, 0.0) + stat.size_diff / tasks
        if stat.size_diff / tasks < SHOWN_FROM:
            continue
        source = linecache.getline(frame.filename, frame.lineno).strip()
        lines.append(
            Line(f"{path}:{frame.lineno}", source, stat.size_diff / tasks, stat.count_diff / tasks)
        )
    lines.sort(key=lambda line: -line.size)
    return Breakdown(tasks, total / tasks, lines, files)


# -- the report ---------------------------------------------------------------------------------


def machine_info() -> dict:
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "django_scheduling"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "python": platform.python_version(),
        "django": metadata.version("django"),
        "apscheduler": metadata.version("apscheduler"),
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "load": os.getloadavg(),
    }


def para(text: str) -> str:
    parts = text.split("`")
    parts[1::2] = [part.replace(" ", "\0") for part in parts[1::2]]
    return textwrap.fill("`".join(parts), 100).replace("\0", " ")


def report(
    info: dict,
    command: str,
    seconds: float,
    results: list[Measured],
    baselines: dict[str, Measured],
    traced: Breakdown | None,
    settle: float,
    note: str,
) -> str:
    load = ", ".join(f"{x:.1f}" for x in info["load"])
    lines = [
        "# Memory per task: `runscheduler` vs APScheduler 3",
        "",
        *([para(f"**{note}**"), ""] if note else []),
        f"- Date: {info['date']}; the run took {seconds:.0f} s.",
        f"- Machine: {info['nproc']} CPUs, {info['cpu']}; 1-minute load average {load} at start.",
        f"- Python {info['python']}, Django {info['django']}, APScheduler "
        f"{info['apscheduler']}; django_scheduling at commit {info['commit']}.",
        f"- Command: `{command}`",
        "",
        para(
            "**ours**: a real `manage.py runscheduler` process (settings "
            "`benchmarks.e2e_project.settings`, `SCHEDULING` at its defaults), on a migrated "
            "SQLite file in WAL mode. **APScheduler 3**: `BackgroundScheduler`, "
            "`ThreadPoolExecutor(10)`, in memory. The same N closures, all due at the same "
            "second of the minute (`S * * * * *`; `CronTrigger(second=S)`), S a minute after "
            "the launch: none runs while measured. **RSS / task** = (RSS of the process with N "
            "tasks - RSS of one with 1 task) / N, once it has started and sat idle for "
            f"{settle:g} s (`--settle`). Goal (issue 11): at most 1 KB per task at 10,000 tasks."
        ),
        "",
        "| system | tasks | RSS | RSS - 1 task | RSS / task | start-up |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system in ("ours", "apscheduler"):
        base = baselines.get(system)
        if base is None:
            continue
        lines.append(
            f"| {TITLES[system]} | 1 | {base.rss / 2**20:,.1f} MiB | | | {base.startup:.1f} s |"
        )
        for result in results:
            if result.system != system:
                continue
            extra = result.rss - base.rss
            lines.append(
                f"| {TITLES[system]} | {result.tasks:,} | {result.rss / 2**20:,.1f} MiB "
                f"| {extra / 2**20:,.1f} MiB | {extra / result.tasks:,.0f} B "
                f"| {result.startup:.1f} s |"
            )
    if traced is not None:
        tasks, total = traced.tasks, traced.total
        rss = next(
            (
                r.rss - baselines["ours"].rss
                for r in results
                if r.system == "ours" and r.tasks == tasks
            ),
            None,
        )
        lines += [
            "",
            f"## Where ours goes, at {tasks:,} tasks",
            "",
            para(
                f"tracemalloc (one frame) in a process with {tasks:,} tasks minus one with 1 "
                f"task, by the line that allocated, per task; lines of {SHOWN_FROM:.0f} B or "
                f"more. Python objects in all: **{total:,.0f} B per task**"
                + (
                    f" of the {rss / tasks:,.0f} B of RSS per task measured above. The rest is "
                    "mostly the allocators' slack: the arenas and free memory that the transient "
                    "objects of the start-up (the rows read and written when the tasks are "
                    "synced) leave behind, pinned by the objects that stay; and memory outside "
                    "Python's heap (SQLite's)."
                    if rss is not None
                    else "."
                )
            ),
            "",
            "| B / task | blocks / task | where | line |",
            "| ---: | ---: | --- | --- |",
        ]
        for line in traced.lines:
            source = line.source.replace("|", "\\|")
            lines.append(f"| {line.size:,.0f} | {line.count:.2f} | `{line.where}` | `{source}` |")
        files = sorted(traced.files.items(), key=lambda item: -item[1])
        lines += [
            "",
            para(
                "By file (the benchmark's own tasks are `benchmarks/e2e_project/bench_tasks/"
                "tasks.py`: a closure, its cell and its name, what any project's tasks cost):"
            ),
            "",
            "| B / task | file |",
            "| ---: | --- |",
            *(f"| {size:,.0f} | `{path}` |" for path, size in files if size >= SHOWN_FROM),
        ]
    return "\n".join(lines) + "\n"


# -- the driver ---------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks",
        type=lambda text: [int(n) for n in text.split(",")],
        default=list(TASKS),
        help="default 1000,10000",
    )
    parser.add_argument("--systems", default="ours,apscheduler", help="ours,apscheduler")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds idle before the RSS")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the tracemalloc pair")
    parser.add_argument("--no-write", action="store_true", help="print the results only")
    parser.add_argument("--note", default="", help="a line for the header of the results")
    parser.add_argument("--traced-child", action="store_true", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.traced_child:
        args.rest = rest
        return args
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.systems = [s for s in args.systems.split(",") if s]
    if not set(args.systems) <= set(READY):
        parser.error("--systems is ours, apscheduler or both")
    shown = [
        a
        for a, before in zip(argv, ["", *argv], strict=False)
        if "--note" not in (a, before) and not a.startswith("--note=")
    ]
    args.command = " ".join(["python", "benchmarks/bench_memory.py", *shown])
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.traced_child:
        traced_child(args.rest)
        return
    info = machine_info()
    began = time.monotonic()
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    results: list[Measured] = []
    baselines: dict[str, Measured] = {}
    traced = None
    try:
        template = migrate_template(ARTIFACTS)
        for system in args.systems:
            baselines[system] = measure(system, 1, ARTIFACTS, template, args.settle)
            for tasks in args.tasks:
                result = measure(system, tasks, ARTIFACTS, template, args.settle)
                per_task = (result.rss - baselines[system].rss) / tasks
                print(
                    f"{system:12} {tasks:>7,} tasks: {per_task:7,.0f} B / task "
                    f"(start-up {result.startup:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                results.append(result)
        if "ours" in args.systems and not args.no_breakdown:
            tasks = max(args.tasks)
            base = traced_snapshot(1, ARTIFACTS, template, args.settle)
            loaded = traced_snapshot(tasks, ARTIFACTS, template, args.settle)
            traced = breakdown(base, loaded, tasks)
    except KeyboardInterrupt:
        print("interrupted: child processes stopped, nothing written", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        cleanup()
    text = report(
        info,
        args.command,
        time.monotonic() - began,
        results,
        baselines,
        traced,
        args.settle,
        args.note,
    )
    print(text)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "memory.md").write_text(text)


if __name__ == "__main__":
    main()
