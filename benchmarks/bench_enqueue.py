"""Enqueue throughput: firings put on a queue, ours against celery beat and django-crontask.

Every system runs as its users run it: real processes with their default options, N tasks
(``--tasks``, default 100 and 1,000), each due every second, and nothing else on the machine
from this benchmark. Firings are **enqueued, never run**: no worker consumes the tasks, and the
benchmark counts what reached the queue, from the queue itself.

- **ours, django.tasks**: ``manage.py runscheduler``, 1 and 3 instances, on django.tasks Tasks
  with django-tasks-db (the claim and the enqueue commit in one transaction),
  ``@scheduled(cron="* * * * * *")``.
- **ours, Celery**: the same on Celery tasks, onto Redis; 1 and 3 instances.
- **celery beat**: ``celery beat``, one process, ``beat_schedule`` with the same N tasks,
  ``"schedule": 1.0``, onto the same Redis.
- **django-crontask 2.0.1**: ``manage.py crontask`` (APScheduler 3, one process, no Redis
  lock), ``@cron(CronTrigger(second="*"))`` on the same django.tasks Tasks (django-tasks-db).
  It needs Python >= 3.12 and Django >= 6.0: where it is not installed, its rows are left out
  and the results say so.
- ``--duplicates`` (on by default, 100 tasks): two celery beats and two django-crontasks, the
  same schedule each, to show what a second instance of a one-process scheduler does.

The scheduler database is PostgreSQL (``scripts/postgres-test-server``, or ``BENCH_POSTGRES_URL``;
a fresh database ``scheduling_enqueue`` per configuration, migrated first), and Redis is
``scripts/redis-test-server`` (or ``BENCH_REDIS_URL``; its database is flushed per
configuration). Servers the benchmark starts, it stops at the end.

What it counts, over a window of ``--seconds`` whole seconds after a ``--warmup``:

- *django-tasks-db*: the rows of ``DBTaskResult`` with their ``enqueued_at`` (set by
  django-tasks-db when it inserts the row). Ours: each row is joined with the run of our
  history that enqueued it (``TaskRun.result_id``) for the fire time it serves; a row of a
  burst enqueued ahead of its fire time carries ``run_after`` (no worker takes it before), and
  counts as arriving then.
  django-crontask: each row is matched to the latest whole second at or before its
  ``enqueued_at`` (its trigger's fire times are the whole seconds).
- *Celery*: a thread of this process pops the messages off the Redis list as they arrive
  (``RPOP``/``BRPOP``: consumed, never run) and notes when; a message with an ``eta`` (ours,
  for a burst published ahead of its fire time: a worker holds it until then) counts as
  arriving at its ``eta`` if it came earlier. Ours: the message's id is the run's
  ``result_id``, hence its fire time. celery beat: its messages carry no fire time, and an
  interval schedule counts from the last send (``last_run_at`` is set when an entry is sent), so
  a task's fire times are not on a grid: its lateness is the gap between two consecutive sends
  of the same task minus the 1 s interval, and *missed* is the deficit (due - sent).

Figures per configuration: enqueues per second (arrived in the window / its length) against
due (N per second); fire times of the window missed (not enqueued by the end of a 3 s drain);
duplicates (fire times enqueued more than once: for several instances of ours this must be 0);
p50 / p99 / max lateness = arrival on the queue - fire time; CPU of the scheduler processes
(user + system / wall, % of one core, all instances).

Figures go to ``benchmarks/results/enqueue.md`` and ``enqueue.json`` (``--output NAME``:
``NAME.md``, ``NAME.json``); logs of the last run to ``test-artifacts/bench-enqueue/``. Loopback
only. The environment with every system (Python
3.13, Django 6.1, django-tasks-db, Celery with Redis, django-crontask 2.0.1) is a nox session:

    nox -s bench-enqueue                                  # everything, about 6 minutes
    nox -s bench-enqueue -- --quick                       # 100 tasks, 6 s windows; prints
    nox -s bench-enqueue -- --systems ours-tasks,crontask --tasks 1000 --no-write
    python benchmarks/bench_enqueue.py                    # in any environment with the packages

Options: ``--systems`` (``ours-tasks,ours-celery,beat,crontask``), ``--instances 1,3`` (ours),
``--tasks 100,1000``, ``--seconds`` (default 12; quick 6), ``--warmup`` (default 3),
``--no-duplicates``, ``--conn-max-age SECONDS`` (Django's ``CONN_MAX_AGE`` for the Django
processes; default: unset, i.e. 0), ``--output NAME``, ``--note TEXT``, ``--write`` /
``--no-write``, ``--keep``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_end_to_end import (  # noqa: E402
    Child,
    Failed,
    cleanup,
    interrupt_on_sigterm,
    migrate,
    percentile,
    sleep_until,
    stop_all,
    without_nan,
)

RESULTS = BENCH_DIR / "results"
ARTIFACTS = ROOT / "test-artifacts" / "bench-enqueue"
SETTINGS = "benchmarks.enqueue_project.settings"
CELERY_APP = "benchmarks.enqueue_project.celery_app"
DB_NAME = "scheduling_enqueue"
QUEUE = "celery"  # Celery's default queue: a Redis list of that name

SYSTEMS = ("ours-tasks", "ours-celery", "beat", "crontask")
TITLES = {
    "ours-tasks": "ours, django.tasks (django-tasks-db)",
    "ours-celery": "ours, Celery (Redis)",
    "beat": "celery beat (Redis)",
    "crontask": "django-crontask (django-tasks-db)",
}
READY = {
    "ours-tasks": "Scheduler running",
    "ours-celery": "Scheduler running",
    "beat": "is starting.",
    "crontask": "Starting scheduler",
}
DRAIN = 3.0
STOP_TIMEOUT = 20
_time = time.time


@dataclass(frozen=True)
class Config:
    system: str
    tasks: int
    instances: int

    @property
    def title(self) -> str:
        title = TITLES[self.system]
        if self.system.startswith("ours"):
            return f"{title} x{self.instances}"
        if self.instances > 1:
            return f"{title} x{self.instances} (unsupported)"
        return title

    @property
    def on_redis(self) -> bool:
        return self.system in ("ours-celery", "beat")


# -- servers -------------------------------------------------------------------------------------


class Servers:
    """PostgreSQL and Redis: from the environment, or the test servers, started when needed."""

    def __init__(self) -> None:
        self.started: list[Path] = []
        self.postgres = self._url("BENCH_POSTGRES_URL", "postgres-test-server", self._pg_up)
        self.redis = self._url("BENCH_REDIS_URL", "redis-test-server", self._redis_up)
        import psycopg
        import redis

        parts = urlsplit(self.postgres)
        self.pg_base = f"{parts.scheme}://{parts.netloc}"
        self.pg = psycopg.connect(f"{self.pg_base}/postgres", autocommit=True)
        self.redis_client = redis.Redis.from_url(self.redis)

    def _url(self, variable: str, script_name: str, up: Any) -> str:
        if url := os.environ.get(variable):
            return url
        script = ROOT / "scripts" / script_name
        url = self._script_url(script)
        if not up(url):
            subprocess.run([str(script), "start"], check=True, timeout=300)
            self.started.append(script)
            url = self._script_url(script)
        return url

    @staticmethod
    def _script_url(script: Path) -> str:
        done = subprocess.run([str(script), "url"], check=True, capture_output=True, text=True)
        return done.stdout.strip()

    @staticmethod
    def _pg_up(url: str) -> bool:
        import psycopg

        try:
            psycopg.connect(url, connect_timeout=2).close()
        except psycopg.Error:
            return False
        return True

    @staticmethod
    def _redis_up(url: str) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(url, socket_connect_timeout=2).ping())
        except redis.RedisError:
            return False

    def fresh_database(self) -> str:
        self.pg.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        self.pg.execute(f"CREATE DATABASE {DB_NAME}")
        return f"{self.pg_base}/{DB_NAME}"

    def close(self) -> None:
        try:
            self.pg.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
            self.pg.close()
            self.redis_client.flushdb()
        finally:
            for script in self.started:
                subprocess.run([str(script), "stop"], check=False, timeout=120)


class Consumer(threading.Thread):
    """Pop Celery's messages off the Redis list as they arrive, noting when (never run them)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        import redis

        self.client = redis.Redis.from_url(url)
        self.received: list[tuple[float, bytes]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        client, received = self.client, self.received
        while not self.stopping.is_set():
            batch = client.rpop(QUEUE, 1000)
            if batch:
                now = _time()
                received.extend((now, message) for message in batch)
                continue
            popped = client.brpop([QUEUE], timeout=0.05)
            if popped:
                received.append((_time(), popped[1]))

    def stop(self) -> None:
        """Stop once the list is empty."""
        deadline = time.monotonic() + 30
        while self.client.llen(QUEUE) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stopping.set()
        self.join(5)

    def messages(self) -> list[tuple[float, str, str]]:
        """Return ``(arrival, task name, message id)`` of each message. A message with an
        ``eta`` (ours: a burst published ahead of its fire time) counts as arriving then, if
        it came earlier: no worker runs it before."""
        out = []
        for arrival, raw in self.received:
            headers = json.loads(raw)["headers"]
            if headers.get("eta"):
                arrival = max(arrival, datetime.fromisoformat(headers["eta"]).timestamp())
            out.append((arrival, headers["task"], headers["id"]))
        return out


# -- one configuration ---------------------------------------------------------------------------


class Runner:
    def __init__(self, args: argparse.Namespace, servers: Servers) -> None:
        self.args = args
        self.servers = servers

    def env(self, config: Config, extra: dict[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("DJANGO_SETTINGS_MODULE", "SCHEDULING_AUTOSTART"):
            env.pop(name, None)
        env.update(
            PYTHONUNBUFFERED="1",
            BENCH_SYSTEM=config.system,
            BENCH_TASKS=str(config.tasks),
            BENCH_REDIS_URL=self.servers.redis,
        )
        if config.system != "beat":  # beat runs without Django, as it can
            env["DJANGO_SETTINGS_MODULE"] = SETTINGS
            if self.args.conn_max_age is not None:
                env["BENCH_CONN_MAX_AGE"] = str(self.args.conn_max_age)
        env.update(extra)
        return env

    def command(self, config: Config, work: Path, number: int) -> list[str]:
        if config.system == "beat":
            schedule = work / f"celerybeat-schedule-{number}"
            return [sys.executable, "-m", "celery", "-A", CELERY_APP, "beat", "-s", str(schedule)]
        name = "crontask" if config.system == "crontask" else "runscheduler"
        return [sys.executable, "manage.py", name]

    def run(self, config: Config) -> dict:
        work = ARTIFACTS / f"{config.system}-{config.tasks}-x{config.instances}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        database_url = self.servers.fresh_database()
        self.servers.redis_client.flushdb()
        env = self.env(config, {"DATABASE_URL": database_url})
        if config.system != "beat":
            migrate(env)
        consumer = Consumer(self.servers.redis) if config.on_redis else None
        if consumer is not None:
            consumer.start()
        children: list[Child] = []
        restarts: list[str] = []
        began = _time()
        try:

            def launch(number: int, attempt: int = 1) -> Child:
                label = f"{config.system}{number + 1}"
                log = work / f"{label}-{attempt}.log"
                return Child(label, self.command(config, work, number), env, log)

            children.extend(launch(number) for number in range(config.instances))
            ready_at = wait_ready(config, children, launch, restarts)
            first = float(math.ceil(ready_at + self.args.warmup))
            end = first + self.args.seconds
            load_before = os.getloadavg()
            sleep_until(first)
            cpu_before = [child.cpu_seconds() for child in children]
            measured_from = _time()
            sleep_until(end)
            cpu_after = [child.cpu_seconds() for child in children]
            measured_to = _time()
            sleep_until(end + DRAIN)
            for child in children:
                if not child.alive():
                    raise Failed(f"{child.label} exited during the window:\n{child.output_tail()}")
            load_after = os.getloadavg()
        finally:
            failed = stop_all(children, STOP_TIMEOUT)
            if consumer is not None:
                consumer.stop()
        wall = measured_to - measured_from
        cpu = [(b - a) / wall * 100 for a, b in zip(cpu_before, cpu_after, strict=True)]
        slots = [first + k for k in range(self.args.seconds)]
        if config.on_redis:
            assert consumer is not None
            records = celery_records(config, consumer.messages(), database_url)
        else:
            records = database_records(config, database_url)
        result = {
            "system": config.system,
            "title": config.title,
            "tasks": config.tasks,
            "instances": config.instances,
            "window": {"first_slot": first, "seconds": self.args.seconds, "drain": DRAIN},
            "cpu_percent_each": cpu,
            "cpu_percent": sum(cpu),
            "startup_seconds": ready_at - began,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "unclean_stop": [child.label for child in failed],
            "startup_restarts": restarts,
        }
        result.update(analyse(config, slots, records))
        if not self.args.keep:
            shutil.rmtree(work, ignore_errors=True)
        return result


def wait_ready(config: Config, children: list[Child], launch: Any, restarts: list[str]) -> float:
    """Wait until every child is ready; return when the last one was.

    An instance of ours that exits during start-up is started again, once, as a process
    supervisor would (systemd's ``Restart=on-failure``); *restarts* gets why it exited.
    """
    deadline = time.monotonic() + 120 + config.tasks * 0.03
    waiting = list(children)
    while waiting:
        for child in list(waiting):
            if child.saw(READY[config.system]):
                child.ready_at = _time()
                waiting.remove(child)
            elif not child.alive():
                output = child.output_tail()
                number = children.index(child)
                if not config.system.startswith("ours") or child.log_path.stem.endswith("-2"):
                    raise Failed(f"{child.label} exited during start-up:\n{output}")
                restarts.append(f"{child.label}: {output.splitlines()[-1] if output else '?'}")
                print(f"   {child.label} exited during start-up; started again", flush=True)
                child.kill()
                waiting.remove(child)
                children[number] = launch(number, attempt=2)
                waiting.append(children[number])
        if time.monotonic() > deadline:
            raise Failed(f"{waiting[0].label} did not start in time:\n{waiting[0].output_tail()}")
        time.sleep(0.05)
    return max(child.ready_at or 0.0 for child in children)


#: One enqueue: (task, the fire time it serves or None when unknown, arrival on the queue).
Record = tuple[str, float | None, float]


def database_records(config: Config, url: str) -> list[Record]:
    import psycopg

    with psycopg.connect(url) as db:
        if config.system == "ours-tasks":
            # A row enqueued ahead of its fire time (a burst claimed ahead) waits for its
            # run_after: no worker can take it before, so it counts as arriving then.
            rows = db.execute(
                "SELECT t.task_path, r.scheduled_at,"
                " CASE WHEN t.run_after < '9000-01-01' AND t.run_after > t.enqueued_at"
                " THEN t.run_after ELSE t.enqueued_at END"
                " FROM django_tasks_database_dbtaskresult t"
                " LEFT JOIN django_scheduling_taskrun r ON r.result_id = t.id::text"
            ).fetchall()
            return [(task, fire and fire.timestamp(), at.timestamp()) for task, fire, at in rows]
        rows = db.execute(
            "SELECT task_path, enqueued_at FROM django_tasks_database_dbtaskresult"
            " WHERE task_path LIKE 'benchmarks.%%'"  # not crontask's heartbeat
        ).fetchall()
    # crontask: the latest whole second at or before the enqueue.
    return [(task, float(math.floor(at.timestamp())), at.timestamp()) for task, at in rows]


def celery_records(
    config: Config, messages: list[tuple[float, str, str]], url: str
) -> list[Record]:
    if config.system == "beat":
        return [(task, None, arrival) for arrival, task, _ in messages]
    import psycopg

    with psycopg.connect(url) as db:
        fire_times = {
            result_id: fire.timestamp()
            for result_id, fire in db.execute(
                "SELECT result_id, scheduled_at FROM django_scheduling_taskrun"
                " WHERE result_id <> ''"
            )
        }
    return [(task, fire_times.get(mid), arrival) for arrival, task, mid in messages]


def analyse(config: Config, slots: list[float], records: list[Record]) -> dict:
    """Match the enqueues to the fire times of the window and compute the figures."""
    start, end = slots[0], slots[-1] + 1
    deadline = end + DRAIN
    arrived = sum(1 for _, _, at in records if start <= at < end)
    due = config.tasks * len(slots)
    figures: dict[str, Any] = {
        "due": due,
        "due_per_second": float(config.tasks),
        "enqueued_in_window": arrived,
        "enqueued_per_second": arrived / len(slots),
        "records": len(records),
    }
    if config.system == "beat":
        # Interval schedules count from the last send: lateness = gap - 1 s, per task (with
        # two beats, their sends interleave and the gaps say nothing).
        sends: dict[str, list[float]] = defaultdict(list)
        for task, _, at in records:
            sends[task].append(at)
        lateness = []
        for times in sends.values():
            times.sort()
            lateness += [
                (later - earlier - 1.0) * 1e3
                for earlier, later in itertools.pairwise(times)
                if start <= later < end and config.instances == 1
            ]
        lateness.sort()
        figures.update(
            missed=max(due - arrived, 0) if config.instances == 1 else None,
            missed_kind="deficit",
            duplicates=max(arrived - due, 0) if config.instances > 1 else None,
            no_fire_time=0,
        )
    else:
        window = set(slots)
        counts: Counter[tuple[str, float]] = Counter()
        first: dict[tuple[str, float], float] = {}
        no_fire_time = 0
        for task, fire, at in records:
            if fire is None:
                no_fire_time += 1
                continue
            if fire not in window or at > deadline:
                continue
            key = (task, fire)
            counts[key] += 1
            first[key] = min(first.get(key, at), at)
        lateness = sorted((at - fire) * 1e3 for (_, fire), at in first.items())
        figures.update(
            missed=due - len(first),
            missed_kind="fire times",
            duplicates=sum(count - 1 for count in counts.values()),
            no_fire_time=no_fire_time,
        )
    figures["lateness_ms"] = {
        "p50": percentile(lateness, 0.50),
        "p99": percentile(lateness, 0.99),
        "max": lateness[-1] if lateness else math.nan,
        "count": len(lateness),
    }
    return figures


# -- plan and report -----------------------------------------------------------------------------


def installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def crontask_available() -> bool:
    import django

    return installed("django-crontask") is not None and django.VERSION >= (6, 0)


def plan(args: argparse.Namespace) -> list[Config]:
    configs = []
    for tasks in args.tasks:
        for system in args.systems:
            if system == "crontask" and not crontask_available():
                print(
                    "django-crontask skipped: it needs Python >= 3.12, Django >= 6.0 and "
                    "django-crontask installed (nox -s bench-enqueue has them)",
                    file=sys.stderr,
                )
                continue
            for instances in args.instances if system.startswith("ours") else [1]:
                configs.append(Config(system, tasks, instances))
    if args.duplicates:
        tasks = min(args.tasks)
        for system in ("beat", "crontask"):
            if system in args.systems and (system != "crontask" or crontask_available()):
                configs.append(Config(system, tasks, 2))
    return configs


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
    redis_version = "?"
    try:
        done = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
        redis_version = done.stdout.split("v=", 1)[1].split()[0]
    except (OSError, IndexError):
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "python": platform.python_version(),
        "commit": commit or "unknown",
        "load_average_at_start": os.getloadavg(),
        "versions": {
            name: installed(name)
            for name in (
                "django",
                "django-tasks",
                "django-tasks-db",
                "celery",
                "kombu",
                "redis",
                "django-crontask",
                "apscheduler",
                "psycopg",
            )
        },
        "redis_server": redis_version,
    }


def fmt_ms(value: float) -> str:
    if value is None or math.isnan(value):
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def markdown_table(results: list[dict]) -> str:
    lines = [
        "| system | tasks | enqueued / s (due) | missed | dup | p50 ms | p99 ms | max ms | CPU % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        if "error" in result:
            lines.append(f"| {result['title']} | {result['tasks']:,} | failed: see JSON |||||||")
            continue
        late = result["lateness_ms"]
        missed = result["missed"]
        if missed is None:
            missed_text = "—"
        else:
            share = f"{missed / result['due']:.0%}" if missed and result["due"] else ""
            kind = "deficit" if result["missed_kind"] == "deficit" else ""
            detail = ", ".join(filter(None, (share, kind)))
            missed_text = f"{missed:,}" + (f" ({detail})" if detail else "")
        dup = "—" if result["duplicates"] is None else f"{result['duplicates']:,}"
        lines.append(
            f"| {result['title']} | {result['tasks']:,} | "
            f"{result['enqueued_per_second']:,.1f} ({result['due_per_second']:,.0f}) | "
            f"{missed_text} | {dup} | {fmt_ms(late['p50'])} | {fmt_ms(late['p99'])} | "
            f"{fmt_ms(late['max'])} | {result['cpu_percent']:.0f} |"
        )
    return "\n".join(lines)


def write_results(info: dict, args: argparse.Namespace, results: list[dict], minutes: float) -> str:
    load = ", ".join(f"{x:.1f}" for x in info["load_average_at_start"])
    loads = [r["load_average_after"][0] for r in results if "load_average_after" in r]
    load_range = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?"
    versions = info["versions"]

    def para(text: str) -> str:
        parts = text.split("`")
        parts[1::2] = [part.replace(" ", "\0") for part in parts[1::2]]
        return textwrap.fill("`".join(parts), 100).replace("\0", " ")

    def bullet(text: str) -> str:
        return textwrap.fill(text, 100, initial_indent="- ", subsequent_indent="  ")

    skipped = ""
    if "crontask" in args.systems and not crontask_available():
        skipped = (
            " django-crontask is not installed here (it needs Python >= 3.12 and Django >= 6.0; "
            "`nox -s bench-enqueue` has it): its rows are missing."
        )
    tasks_pkg = (
        f"django-tasks {versions['django-tasks']} (backport), " if versions["django-tasks"] else ""
    )
    lines = [
        "# Enqueue throughput: `runscheduler` vs celery beat and django-crontask",
        "",
        *([para(f"**{args.note}**"), ""] if args.note else []),
        bullet(f"Date: {info['date']}; the run took {minutes:.1f} min."),
        bullet(
            f"Machine: {info['nproc']} CPUs, {info['cpu']}; 1-minute load average {load} at "
            f"start, {load_range} at the end of the configurations (the machine is shared; "
            "only figures of one run compare)."
        ),
        bullet(
            f"Python {info['python']}, Django {versions['django']}, {tasks_pkg}"
            f"django-tasks-db {versions['django-tasks-db']}, Celery {versions['celery']} "
            f"(kombu {versions['kombu']}, redis-py {versions['redis']}), Redis "
            f"{info['redis_server']}, django-crontask {versions['django-crontask'] or '—'} "
            f"(APScheduler {versions['apscheduler'] or '—'}), PostgreSQL via psycopg "
            f"{versions['psycopg']}; django_scheduling at commit {info['commit']}."
        ),
        f"- Command: `{args.command}`",
        *(
            [
                bullet(
                    f"Django processes with `CONN_MAX_AGE = {args.conn_max_age}` (not Django's 0)."
                )
            ]
            if args.conn_max_age is not None
            else []
        ),
        "",
        para(
            f"N tasks, each due every second, **enqueued and never run** (no workers), every "
            f"system with its default options. **ours**: `manage.py runscheduler` x1 and x3, "
            f'`@scheduled(cron="* * * * * *")` on django.tasks Tasks with django-tasks-db '
            f"(claim and enqueue in one transaction) or on Celery tasks (published after the "
            f"claim commits); history and locks on PostgreSQL. **celery beat**: one process, "
            f'`beat_schedule` with the same N tasks, `"schedule": 1.0`. **django-crontask**: '
            f"`manage.py crontask` (APScheduler 3 `BlockingScheduler`, no Redis lock), "
            f'`@cron(CronTrigger(second="*"))` on the same Tasks, django-tasks-db on '
            f"PostgreSQL.{skipped} Window: {args.seconds} whole seconds after a {args.warmup} s "
            f"warm-up; a fresh database and an empty Redis per configuration."
        ),
        "",
        para(
            "**enqueued / s** = enqueues that reached the queue in the window / its length "
            "(due: N per second). Read from the queue: django-tasks-db rows and their "
            "`enqueued_at`; Celery messages popped off the Redis list by the benchmark as they "
            "arrive (consumed, never run). **missed** = fire times of the window not enqueued "
            f"within {DRAIN:.0f} s after it; **dup** = fire times enqueued more than once. "
            "**p50 / p99 / max** = arrival on the queue - fire time. Fire times: ours, the run "
            "of our history that enqueued the row or message (`TaskRun.result_id`); "
            "django-crontask, the latest whole second at or before `enqueued_at` (so an enqueue "
            "1 s late or more counts against the next second: a *dup* there and a *missed* "
            "here, which may be this matching's and not django-crontask's). celery "
            "beat's messages carry no fire time, and its interval counts from the last send: "
            "its lateness is the gap between two sends of a task - 1 s, and its *missed* the "
            "deficit (due - sent). **CPU** = user + system time of the scheduler processes / "
            "wall time, % of one core, all instances."
        ),
        "",
        markdown_table(results),
        "",
        *notes(results),
        "## What this shows",
        "",
        para(summary(results)),
        "",
        para(
            "Everything per configuration (per-instance CPU, start-up, load): "
            f"`{args.output}.json`."
        ),
        "",
    ]
    text = "\n".join(lines)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.output}.md").write_text(text)
    payload = {"machine": info, "command": args.command, "note": args.note, "results": results}
    (RESULTS / f"{args.output}.json").write_text(json.dumps(without_nan(payload), indent=2) + "\n")
    return text


def notes(results: list[dict]) -> list[str]:
    """Return the lines on configurations that failed or whose instances were restarted."""

    def bullet(text: str) -> str:
        return textwrap.fill(text, 100, initial_indent="- ", subsequent_indent="  ")

    lines = []
    for result in results:
        for restart in result.get("startup_restarts", []):
            label, _, last = restart.partition(": ")
            lines.append(
                bullet(
                    f"{result['title']}, {result['tasks']:,} tasks: {label} exited during "
                    f"start-up and was started again once, as a supervisor would (the last line "
                    f"of its output: `{last.strip()}`)."
                )
            )
        if "error" in result:
            text = result["error"].strip().splitlines() or ["?"]
            reason = text[0] if len(text) == 1 else f"{text[0]} ... {text[-1]}"
            lines.append(bullet(f"{result['title']}, {result['tasks']:,} tasks, failed: {reason}"))
    return [*lines, ""] if lines else []


SHORT = {
    "ours-tasks": "ours on django-tasks-db",
    "ours-celery": "ours on Celery",
    "beat": "celery beat",
    "crontask": "django-crontask",
}


def summary(results: list[dict]) -> str:
    """Return the "what this shows" paragraph, from the figures of this run."""
    ok = [r for r in results if "error" not in r]

    def name(result: dict) -> str:
        short = SHORT[result["system"]]
        return f"{short} x{result['instances']}" if result["system"].startswith("ours") else short

    parts = []
    several = [r for r in ok if r["system"].startswith("ours") and r["instances"] > 1]
    if several:
        parts.append(
            f"**Duplicates:** {sum(r['duplicates'] for r in several)} fire times enqueued twice "
            f"by three active `runscheduler` instances over {len(several)} configurations "
            "(both engines): each fire time is claimed once."
        )
    for tasks in sorted({r["tasks"] for r in ok}):
        row = [
            f"{name(r)} {r['enqueued_per_second']:,.0f}/s (p99 {fmt_ms(r['lateness_ms']['p99'])} "
            f"ms, CPU {r['cpu_percent']:.0f} %)"
            for r in ok
            if r["tasks"] == tasks and (r["system"].startswith("ours") or r["instances"] == 1)
        ]
        parts.append(f"**{tasks:,} tasks ({tasks:,}/s due):** " + "; ".join(row) + ".")
    short = [r for r in ok if r["system"].startswith("ours") and r["missed"]]
    if short:
        best = max(r["enqueued_per_second"] for r in short)
        cost = [
            r["cpu_percent"] * 10 / r["enqueued_per_second"]
            for r in short
            if r["instances"] == 1 and r["enqueued_per_second"]
        ]
        parts.append(
            f"**Where ours falls short:** it enqueued at most {best:,.0f} firings per second "
            "here, with one instance or three (they contend for the same fire times); "
            "the other fire times were never enqueued"
            + (
                f"; {min(cost):.0f}-{max(cost):.0f} ms of scheduler CPU per enqueue with one "
                "instance."
                if cost
                else "."
            )
        )
    demos = [r for r in ok if not r["system"].startswith("ours") and r["instances"] > 1]
    if demos:
        listed = ", ".join(
            f"{name(r)} x2: {r['duplicates']:,} in {r['window']['seconds']} s" for r in demos
        )
        parts.append(
            f"**A second instance of a one-process scheduler** enqueues everything again "
            f"({listed}); django-crontask's optional Redis lock makes a second instance wait "
            "instead (one active scheduler, the other on standby)."
        )
    return " ".join(parts)


def comma_list(choices: Sequence[str] | None, cast: Any = str) -> Any:
    def parse(text: str) -> list:
        values = [cast(part.strip().replace("_", "")) for part in text.split(",") if part.strip()]
        if choices is not None and (unknown := [v for v in values if v not in choices]):
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(str, unknown))}; choose from {', '.join(choices)}"
            )
        return values

    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", type=comma_list(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument("--instances", type=comma_list(None, int), default=[1, 3])
    parser.add_argument("--tasks", type=comma_list(None, int), help="default 100,1000")
    parser.add_argument("--seconds", type=int, help="window (default 12; quick 6)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-duplicates", dest="duplicates", action="store_false")
    parser.add_argument(
        "--conn-max-age", type=int, help="CONN_MAX_AGE of the Django processes (default 0)"
    )
    parser.add_argument("--quick", action="store_true", help="100 tasks, 6 s; prints only")
    parser.add_argument("--write", action="store_true", help="with --quick: write the results")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--note", default="", help="a line for the header of the results")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    parser.add_argument("--output", default="enqueue", help="results/NAME.md and NAME.json")
    args = parser.parse_args(argv)
    args.tasks = args.tasks or ([100] if args.quick else [100, 1_000])
    if args.seconds is None:
        args.seconds = 6 if args.quick else 12
    if args.seconds < 2 or args.warmup < 1:
        parser.error("--seconds is at least 2 and --warmup at least 1")
    shown = [
        a
        for a, before in zip(argv, ["", *argv], strict=False)
        if "--note" not in (a, before) and not a.startswith("--note=")
    ]
    args.command = " ".join(["python", "benchmarks/bench_enqueue.py", *shown])
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    configs = plan(args)
    began = time.monotonic()
    results: list[dict] = []
    servers = Servers()
    with interrupt_on_sigterm():
        try:
            runner = Runner(args, servers)
            for config in configs:
                print(f"-- {config.title}, {config.tasks:,} tasks", flush=True)
                try:
                    result = runner.run(config)
                except Failed as exc:
                    print(f"   failed: {exc}", file=sys.stderr, flush=True)
                    result = {**config.__dict__, "title": config.title, "error": str(exc)}
                results.append(result)
                if "error" not in result:
                    late = result["lateness_ms"]
                    print(
                        f"   {result['enqueued_per_second']:,.1f}/s, missed {result['missed']}, "
                        f"dup {result['duplicates']}, p50 {fmt_ms(late['p50'])} ms, p99 "
                        f"{fmt_ms(late['p99'])} ms, CPU {result['cpu_percent']:.0f} %",
                        flush=True,
                    )
        except KeyboardInterrupt:
            print("interrupted: child processes stopped, nothing written", file=sys.stderr)
            raise SystemExit(130) from None
        finally:
            cleanup()
            servers.close()
    minutes = (time.monotonic() - began) / 60
    if args.no_write or (args.quick and not args.write):
        print(markdown_table(results))
    else:
        print(write_results(info, args, results, minutes))


if __name__ == "__main__":
    main()
