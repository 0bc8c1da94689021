"""End to end: real ``manage.py runscheduler`` processes on real databases, and APScheduler 3.

The product as users run it: ``runscheduler`` with its defaults (every task locked, history
on, the default pool), the tasks of ``benchmarks/e2e_project`` (its settings leave
``SCHEDULING`` at its defaults, unless ``--no-history``), and a fresh database for each
configuration, migrated first as in a deployment. The one option given,
``--shutdown-timeout 10``, bounds the stop after the measurement. The databases:

- MariaDB with 3 instances: the server of ``scripts/mariadb-test-server`` (started when
  needed), or the one at ``BENCH_MYSQL_URL`` (its database name is ignored: the benchmark
  creates and drops ``scheduling_e2e``). Commits are made durable for the run
  (``innodb_flush_log_at_trx_commit = 1``, as a production server has it), and set back after.
- SQLite with 1 instance: a file, in WAL mode, as the example project configures it.
- PostgreSQL with 3 instances, with ``--databases ...,postgresql``, once django_scheduling
  supports it: ``BENCH_POSTGRES_URL`` (``postgres://user:password@host:port/any``) and psycopg.

N tasks (``--tasks``, default 100, 1,000 and 10,000) in two shapes (``--shapes``):

- ``second``: every task due every second, cron ``* * * * * *``. Cron rather than
  ``fixed_rate="1s"``: its fire times are the whole seconds, which the benchmark computes on its
  own, whereas a fixed rate's grid starts wherever each process happened to start.
- ``minute``: every task due at the same second of each minute, cron ``S * * * * *``. S is
  chosen so that the burst comes right after the warm-up (``--minute-second auto``), which
  spares up to a minute of waiting per configuration; for the product it is the same as
  ``0 * * * * *`` (``--minute-second 0``). One burst is measured per configuration.

Each task records, first thing, ``time.time()`` and the fire time it serves
(``current_fire_time()``) into a per-thread array, written to a file at exit (see
``e2e_project/recorder.py``: about a microsecond a run, no lock, no I/O during the run).
APScheduler 3 runs in the same run, alone on the machine like each of our configurations
(never at the same time): ``BackgroundScheduler`` with a ``ThreadPoolExecutor(10)``, in
memory, the same N and shapes (``CronTrigger(second="*")`` / ``CronTrigger(second=S)``).

What it reports per configuration, over a window after a warm-up (``second``: the fire times
of ``--seconds`` whole seconds; ``minute``: the one burst, followed for ``--seconds``):

- lateness = start minus the intended fire time, computed by the benchmark from the cron
  grid, never taken from the scheduler; p50, p99 and max over the fire times served. Our
  runs are matched to the fire time they say they serve (which must lie on the grid);
  APScheduler does not tell its jobs, so each of its runs is matched to the latest fire time
  at or before its start;
- missed = intended fire times of the window not served by the end of the drain (``second``:
  5 s after the window for ours, 2 s for APScheduler, which drops runs more than its 1 s
  misfire grace time late; ``minute``: the end of the ``--seconds`` followed);
- duplicates = fire times served more than once (by any instance);
- CPU = user + system time of the scheduler processes / wall time, in % of one core (and of
  the MariaDB server, when it is the one this benchmark started);
- statements per firing = statements in the window / runs started in it, summed over the
  instances: MariaDB's ``Questions`` (every statement the server received, ``COMMIT`` and
  autocommit switches included; ``SHOW GLOBAL STATUS`` deltas, with the ``Com_*`` breakdown
  in the JSON) and, for every database, the statements Django's cursors sent (an
  ``execute_wrapper`` on every connection, written out at exit);
- RSS per task (from 1,000 tasks): the RSS of a scheduler process with N tasks at the end of
  its window, minus that of one with 1 task, minus the recording's 24 bytes per run, / N.

Figures go to ``benchmarks/results/end_to_end.md`` and ``end_to_end.json``; logs and records of
the last run to ``test-artifacts/bench-e2e/``. Every child process is stopped at the end, also
on Ctrl-C or an error. Loopback only.

    .venv/bin/python benchmarks/bench_end_to_end.py               # full: 12-15 min on 2 cores
    .venv/bin/python benchmarks/bench_end_to_end.py --quick       # N=100, short windows; prints
    .venv/bin/python benchmarks/bench_end_to_end.py --quick --write   # ... and writes results
    .venv/bin/python benchmarks/bench_end_to_end.py --databases sqlite --tasks 1000 \\
        --shapes second --seconds 20 --no-write

Options: ``--databases mariadb,sqlite[,postgresql]``, ``--tasks 100,1000,10000``,
``--shapes second,minute``, ``--systems ours,apscheduler``, ``--seconds`` (window, default 15;
quick 6), ``--warmup`` (default 5; quick 3), ``--minute-second auto|0-59``, ``--note TEXT``
(a line for the results header), ``--write`` / ``--no-write``, ``--keep`` (keep logs and
records of every configuration), ``--no-history`` (our schedulers with
``SCHEDULING["HISTORY"] = False``; the default keeps the history, as a project that sets
nothing does).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
ARTIFACTS = ROOT / "test-artifacts" / "bench-e2e"
SETTINGS = "benchmarks.e2e_project.settings"

DATABASES = ("mariadb", "sqlite", "postgresql")
SYSTEMS = ("ours", "ours-unlocked", "apscheduler")
#: ``ours-unlocked``: the same tasks with ``lock=False``, one instance, as a new user tries them
#: first (on SQLite, up to 1,000 tasks).
UNLOCKED_DATABASES = ("sqlite",)
UNLOCKED_MAX_TASKS = 1_000
SHAPES = ("second", "minute")
INSTANCES = {"mariadb": 3, "sqlite": 1, "postgresql": 3}
FULL_TASKS = (100, 1_000, 10_000)
QUICK_TASKS = (100,)
APS_THREADS = 10
#: How long after a ``second`` window its fire times may still be served.
DRAIN = {"ours": 5.0, "ours-unlocked": 5.0, "apscheduler": 2.0}
#: ``runscheduler --shutdown-timeout``: only bounds the stop after the measurement.
SHUTDOWN_TIMEOUT = 10
#: The bytes the recording keeps per run (three doubles), subtracted from the RSS.
RECORD_BYTES = 24
#: RSS per task is reported from this many tasks on (below, it is a few pages in all).
RSS_FROM = 1_000
READY = {
    "ours": "Scheduler running",
    "ours-unlocked": "Scheduler running",
    "apscheduler": "APScheduler running",
}
TITLES = {"mariadb": "MariaDB", "sqlite": "SQLite", "postgresql": "PostgreSQL"}

_time = time.time


# -- child processes -----------------------------------------------------------------------------


class Child:
    """A child process in a session of its own, its output in a log file."""

    live: set[Child] = set()

    def __init__(self, label: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.label = label
        self.log_path = log
        self._log = open(log, "wb")  # closed in kill()
        self.popen = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        Child.live.add(self)
        self._offset = 0
        self._tail = b""
        self._terminated = False
        self.ready_at: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def saw(self, text: str) -> bool:
        """Return whether *text* has appeared in the output (read incrementally)."""
        needle = text.encode()
        with open(self.log_path, "rb") as stream:
            stream.seek(self._offset)
            chunk = stream.read()
        self._offset += len(chunk)
        found = needle in self._tail + chunk
        self._tail = (self._tail + chunk)[-len(needle) :]
        return found

    def cpu_seconds(self) -> float:
        """Return user + system CPU time so far (all threads)."""
        seconds = cpu_of(self.pid) if self.alive() else None
        if seconds is None:
            raise Failed(f"{self.label} exited:\n{self.output_tail()}")
        return seconds

    def rss(self) -> int:
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        raise Failed(f"{self.label} exited:\n{self.output_tail()}")

    def output_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_bytes()[-20_000:].decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def terminate(self) -> None:
        """Send SIGTERM, once: a second one could find the default handler back in place."""
        if not self._terminated and self.alive():
            self._terminated = True
            self.popen.send_signal(signal.SIGTERM)

    def stop(self, timeout: float) -> bool:
        """SIGTERM, wait up to *timeout*, then SIGKILL; return whether it exited by itself."""
        self.terminate()
        try:
            self.popen.wait(timeout)
            clean = True
        except subprocess.TimeoutExpired:
            clean = False
        self.kill()
        return clean and self.popen.returncode == 0

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()
        Child.live.discard(self)


def stop_all(children: Sequence[Child], timeout: float) -> list[Child]:
    """Stop *children* together; return those that did not exit cleanly."""
    for child in children:
        child.terminate()
    deadline = time.monotonic() + timeout
    failed = []
    for child in children:
        if not child.stop(max(deadline - time.monotonic(), 0.1)):
            failed.append(child)
    return failed


def cleanup() -> None:
    for child in list(Child.live):
        child.stop(5)


def sleep_until(moment: float) -> None:
    while (left := moment - _time()) > 0:
        time.sleep(min(left, 0.5))


# -- databases -----------------------------------------------------------------------------------


class Database:
    """A database the scheduler processes share: a fresh one for each configuration."""

    key = ""
    title = ""
    #: Where MariaDB's server runs, to measure its CPU; None when it is not ours to watch.
    server_pid: int | None = None

    @property
    def instances(self) -> int:
        return INSTANCES[self.key]

    def open(self) -> None:
        """Make sure the server answers."""

    def fresh(self) -> str:
        """Drop and create the benchmark's database; return its ``DATABASE_URL``."""
        raise NotImplementedError

    def counters(self) -> dict[str, int] | None:
        """Return the server's statement counters, or None where there are none."""
        return None

    def close(self) -> None:
        """Undo what ``open`` changed."""


class MariaDB(Database):
    key, title = "mariadb", "MariaDB"
    name = "scheduling_e2e"

    def open(self) -> None:
        import MySQLdb

        url = os.environ.get("BENCH_MYSQL_URL")
        if not url:
            script = ROOT / "scripts" / "mariadb-test-server"
            subprocess.run([str(script), "start"], check=True, timeout=300)
            url = subprocess.run(
                [str(script), "url"], check=True, capture_output=True, text=True
            ).stdout.strip()
            pidfile = Path(os.environ.get("MARIADB_TEST_DIR", ROOT / ".mariadb")) / "mysqld.pid"
            if pidfile.exists():
                self.server_pid = int(pidfile.read_text().split()[0])
        parts = urlsplit(url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.db = MySQLdb.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or ""),
            passwd=unquote(parts.password or ""),
        )
        self.db.autocommit(True)
        self.flush = int(self._value("SELECT @@GLOBAL.innodb_flush_log_at_trx_commit"))
        self._execute("SET GLOBAL innodb_flush_log_at_trx_commit = 1")

    def _execute(self, sql: str) -> list[tuple]:
        cursor = self.db.cursor()
        cursor.execute(sql)
        rows = list(cursor.fetchall())
        cursor.close()
        return rows

    def _value(self, sql: str) -> Any:
        return self._execute(sql)[0][0]

    def fresh(self) -> str:
        self._execute(f"DROP DATABASE IF EXISTS {self.name}")
        self._execute(
            f"CREATE DATABASE {self.name} CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
        )
        return f"{self.base}/{self.name}"

    def counters(self) -> dict[str, int]:
        rows = self._execute(
            "SHOW GLOBAL STATUS WHERE Variable_name = 'Questions' OR Variable_name LIKE 'Com\\_%'"
        )
        return {name: int(value) for name, value in rows}

    def close(self) -> None:
        try:
            self._execute(f"DROP DATABASE IF EXISTS {self.name}")
            self._execute(f"SET GLOBAL innodb_flush_log_at_trx_commit = {self.flush}")
        finally:
            self.db.close()


class SQLite(Database):
    key, title = "sqlite", "SQLite"

    def fresh(self) -> str:
        self.path = ARTIFACTS / "e2e.sqlite3"
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        return f"sqlite:///{self.path}"

    def close(self) -> None:
        if hasattr(self, "path"):
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)


class PostgreSQL(Database):
    """PostgreSQL, for when django_scheduling supports it (``migrate`` says so when not).

    Server-side statement counts need ``pg_stat_statements``; without them, the statements
    Django sent are reported, as for SQLite.
    """

    key, title = "postgresql", "PostgreSQL"
    name = "scheduling_e2e"

    def open(self) -> None:
        url = os.environ.get("BENCH_POSTGRES_URL")
        if not url:
            raise SystemExit("--databases postgresql needs BENCH_POSTGRES_URL")
        try:
            import psycopg
        except ImportError:
            raise SystemExit("--databases postgresql needs psycopg: pip install psycopg") from None
        parts = urlsplit(url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.db = psycopg.connect(f"{self.base}/postgres", autocommit=True)

    def fresh(self) -> str:
        self.db.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        self.db.execute(f"CREATE DATABASE {self.name}")
        return f"{self.base}/{self.name}"

    def close(self) -> None:
        try:
            self.db.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        finally:
            self.db.close()


DATABASE_CLASSES: dict[str, Callable[[], Database]] = {
    "mariadb": MariaDB,
    "sqlite": SQLite,
    "postgresql": PostgreSQL,
}


# -- one configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    system: str  # "ours", "ours-unlocked" or "apscheduler"
    database: str | None  # None for APScheduler
    tasks: int
    shape: str

    @property
    def ours(self) -> bool:
        return self.system.startswith("ours")

    @property
    def instances(self) -> int:
        if self.system == "ours-unlocked" or not self.database:
            return 1  # lock=False runs on every instance: one, or each firing runs N times
        return INSTANCES[self.database]

    @property
    def title(self) -> str:
        if self.system == "apscheduler":
            return "APScheduler 3, in memory"
        if self.system == "ours-unlocked":
            return f"ours, `lock=False`, {TITLES[self.database or '']} x{self.instances}"
        return f"ours, {TITLES[self.database or '']} x{self.instances}"


@dataclass
class Window:
    """The instants of one measurement, in seconds since the epoch."""

    slots: list[float]  # the intended fire times measured
    start: float  # CPU, statements: from here ...
    end: float  # ... to here
    deadline: float  # runs that start later do not count
    burst_second: int | None = None


@dataclass
class Snapshot:
    at: float
    cpu: list[float]
    server_cpu: float | None
    counters: dict[str, int] | None
    rss: list[int] = field(default_factory=list)


class Failed(Exception):
    """A configuration could not be measured; the message says why."""


def child_env(config: Config, work: Path, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("DJANGO_SETTINGS_MODULE", "SCHEDULING_AUTOSTART"):
        env.pop(name, None)
    env.update(
        DJANGO_SETTINGS_MODULE=SETTINGS,
        PYTHONUNBUFFERED="1",
        BENCH_TASKS=str(config.tasks),
        BENCH_SHAPE=config.shape,
        BENCH_RECORD_DIR=str(work),
        BENCH_LOCK="0" if config.system == "ours-unlocked" else "1",
    )
    env.update(extra)
    return env


def cpu_of(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def snapshot(children: Sequence[Child], db: Database | None, rss: bool = False) -> Snapshot:
    return Snapshot(
        at=_time(),
        cpu=[child.cpu_seconds() for child in children],
        server_cpu=cpu_of(db.server_pid) if db else None,
        counters=db.counters() if db else None,
        rss=[child.rss() for child in children] if rss else [],
    )


class Runner:
    """Run configurations one after the other and keep what each start-up took."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.databases: dict[str, Database] = {}
        self.startup: dict[tuple[str, str | None, int], float] = {}

    def database(self, key: str) -> Database:
        if key not in self.databases:
            db = DATABASE_CLASSES[key]()
            db.open()
            self.databases[key] = db
        return self.databases[key]

    def close(self) -> None:
        for db in self.databases.values():
            try:
                db.close()
            except Exception as exc:  # the results are written already; say and go on
                print(f"closing {db.title}: {exc}", file=sys.stderr)

    def run(self, config: Config, *, seconds: int, warmup: int) -> dict:
        work = (
            ARTIFACTS
            / f"{config.system}-{config.database or 'memory'}-{config.tasks}-{config.shape}"
        )
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        db = self.database(config.database) if config.database else None
        began = _time()
        burst = None
        if config.shape == "minute":
            burst = self.plan_burst(config, warmup)
        extra = {
            "BENCH_MINUTE_SECOND": str(int(burst % 60) if burst else 0),
            "BENCH_HISTORY": "0" if self.args.no_history else "1",
        }
        children: list[Child] = []
        try:
            if config.ours:
                assert db is not None
                extra["DATABASE_URL"] = db.fresh()
                self.migrate(config, work, extra)
                for number in range(config.instances):
                    label = f"instance{number + 1}"
                    env = child_env(config, work, {**extra, "BENCH_LABEL": label})
                    args = [sys.executable, "manage.py", "runscheduler"]
                    args += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT)]
                    children.append(Child(label, args, env, work / f"{label}.log"))
            else:
                env = child_env(config, work, {**extra, "BENCH_LABEL": "apscheduler"})
                args = [sys.executable, str(Path(__file__).resolve()), "--aps-worker"]
                children.append(Child("apscheduler", args, env, work / "apscheduler.log"))
            ready_at = self.wait_ready(config, children)
            self.startup[(config.system, config.database, config.tasks)] = ready_at - began
            window = self.window(config, ready_at, burst, seconds, warmup)
            result = self.measure(config, children, db, window)
        finally:
            failed = stop_all(children, SHUTDOWN_TIMEOUT + 50)
        if failed:
            names = ", ".join(child.label for child in failed)
            raise Failed(f"{names} did not exit cleanly; its records are lost")
        runs = {child.label: read_runs(work, child.label) for child in children}
        statements = {child.label: read_statements(work, child.label) for child in children}
        result.update(analyse(config, window, runs, statements, result))
        result["startup_seconds"] = self.startup[(config.system, config.database, config.tasks)]
        if not self.args.keep:
            shutil.rmtree(work, ignore_errors=True)
        return result

    def migrate(self, config: Config, work: Path, extra: dict[str, str]) -> None:
        migrate(child_env(config, work, {**extra, "BENCH_RECORD_DIR": ""}))

    def plan_burst(self, config: Config, warmup: int) -> float:
        """Return the instant of the burst: after migrate, start-up and the warm-up."""
        if self.args.minute_second != "auto":
            second = int(self.args.minute_second)
            moment = math.floor(_time() / 60) * 60 + second
            return moment if moment > _time() else moment + 60
        known = self.startup.get((config.system, config.database, config.tasks))
        if known is None:
            known = (10 if config.ours else 2) + config.tasks * 3e-3
        return float(math.ceil(_time() + 1.5 * known + warmup + 2))

    def wait_ready(self, config: Config, children: Sequence[Child]) -> float:
        deadline = time.monotonic() + 120 + config.tasks * 0.03
        waiting = list(children)
        while waiting:
            for child in list(waiting):
                if child.saw(READY[config.system]):
                    child.ready_at = _time()
                    waiting.remove(child)
                elif not child.alive():
                    raise Failed(f"{child.label} exited during start-up:\n{child.output_tail()}")
            if time.monotonic() > deadline:
                raise Failed(
                    f"{waiting[0].label} did not start in time:\n{waiting[0].output_tail()}"
                )
            time.sleep(0.1)
        return max(child.ready_at or 0.0 for child in children)

    def window(
        self, config: Config, ready_at: float, burst: float | None, seconds: int, warmup: int
    ) -> Window:
        # Here, not at the top: the APScheduler worker runs this file without the project.
        from django_scheduling.runtime.scheduler import claim_ahead

        if burst is None:
            first = float(math.ceil(ready_at + warmup))
            last = first + seconds
            return Window(
                slots=[first + k for k in range(seconds)],
                start=first,
                end=last,
                deadline=last + DRAIN[config.system],
            )
        while burst - 0.5 < ready_at + min(warmup, 3):
            burst += 60  # start-up took longer than planned: the next minute
        return Window(
            slots=[burst],
            # From before the scheduler claims the burst ahead of its instant, so that its
            # statements and CPU count.
            start=max(burst - claim_ahead(config.tasks) - 0.2, ready_at),
            end=burst + seconds,
            deadline=burst + seconds,
            burst_second=int(burst % 60),
        )

    def measure(
        self, config: Config, children: Sequence[Child], db: Database | None, window: Window
    ) -> dict:
        load_before = os.getloadavg()
        sleep_until(window.start)
        before = snapshot(children, db, rss=True)
        sleep_until(window.end)
        after = snapshot(children, db, rss=True)
        sleep_until(window.deadline)
        for child in children:
            if not child.alive():
                raise Failed(f"{child.label} exited during the window:\n{child.output_tail()}")
        wall = after.at - before.at
        cpu = [(b - a) / wall * 100 for a, b in zip(before.cpu, after.cpu, strict=True)]
        server_cpu = None
        if before.server_cpu is not None and after.server_cpu is not None:
            server_cpu = (after.server_cpu - before.server_cpu) / wall * 100
        counters = None
        if before.counters is not None and after.counters is not None:
            counters = {
                name: after.counters[name] - before.counters.get(name, 0)
                for name in after.counters
                if after.counters[name] != before.counters.get(name, 0)
            }
            # The second SHOW GLOBAL STATUS counted itself.
            counters["Questions"] -= 1
            counters["Com_show_status"] = counters.get("Com_show_status", 1) - 1
        return {
            "system": config.system,
            "database": config.database,
            "instances": config.instances,
            "tasks": config.tasks,
            "shape": config.shape,
            "title": config.title,
            "window": {
                "first_slot": window.slots[0],
                "slots": len(window.slots),
                "measured_from": before.at,
                "measured_to": after.at,
                "deadline": window.deadline,
                "burst_second": window.burst_second,
            },
            "cpu_percent_each": cpu,
            "cpu_percent": sum(cpu),
            "server_cpu_percent": server_cpu,
            "server_counters": counters,
            "rss_end_each": after.rss,
            "rss_end_at": after.at,
            "rss_start_each": before.rss,
            "rss_start_at": before.at,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        }


def migrate(env: dict[str, str]) -> None:
    """Run ``manage.py migrate`` with *env*; raise ``Failed`` with its output if it fails."""
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise Failed(f"manage.py migrate failed:\n{(done.stdout + done.stderr)[-3000:]}")


def read_runs(work: Path, label: str) -> list[tuple[int, float, float]]:
    from benchmarks.e2e_project.recorder import read_records

    paths = list(work.glob(f"{label}-*.runs"))
    if not paths:
        raise Failed(f"{label} wrote no records")
    return [run for path in paths for run in read_records(path)]


def read_statements(work: Path, label: str) -> dict[int, dict[str, int]]:
    merged: dict[int, dict[str, int]] = {}
    for path in work.glob(f"{label}-*.statements.json"):
        for second, verbs in json.loads(path.read_text()).items():
            into = merged.setdefault(int(second), {})
            for verb, number in verbs.items():
                into[verb] = into.get(verb, 0) + number
    return merged


# -- analysis ------------------------------------------------------------------------------------


def percentile(ordered: Sequence[float], q: float) -> float:
    """Return the nearest-rank *q*-quantile (0 < q <= 1) of the sorted values."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def analyse(
    config: Config,
    window: Window,
    runs: dict[str, list[tuple[int, float, float]]],
    statements: dict[str, dict[int, dict[str, int]]],
    measured: dict,
) -> dict:
    """Match runs to the intended fire times of *window* and compute the figures."""
    slots = set(window.slots)
    period = 1.0 if config.shape == "second" else 60.0
    grid = window.slots[0]
    first: dict[tuple[int, float], float] = {}
    duplicates = off_grid = no_fire_time = too_late = 0
    runs_in_window = 0
    window_from, window_to = measured["window"]["measured_from"], measured["window"]["measured_to"]
    for label_runs in runs.values():
        for index, start, fire in label_runs:
            if window_from <= start < window_to:
                runs_in_window += 1
            if config.ours:
                if math.isnan(fire):
                    no_fire_time += 1
                    continue
                slot = fire
                if (slot - grid) % period != 0:
                    off_grid += 1
                    continue
            else:
                slot = grid + math.floor((start - grid) / period) * period
            if slot not in slots:
                continue
            if start > window.deadline:
                too_late += 1
                continue
            key = (index, slot)
            if key in first:
                duplicates += 1
                first[key] = min(first[key], start)
            else:
                first[key] = start
    lateness = sorted((start - slot) * 1e3 for (_, slot), start in first.items())
    expected = config.tasks * len(window.slots)

    seconds = range(math.floor(window_from), math.ceil(window_to))
    django: dict[str, int] = {}
    for per_label in statements.values():
        for second in seconds:
            for verb, number in per_label.get(second, {}).items():
                django[verb] = django.get(verb, 0) + number
    django_total = sum(django.values())
    counters = measured["server_counters"]
    per_run = max(runs_in_window, 1)

    return {
        "expected": expected,
        "served": len(first),
        "missed": expected - len(first),
        "duplicates": duplicates,
        "off_grid": off_grid,
        "no_fire_time": no_fire_time,
        "served_after_deadline": too_late,
        "early": sum(1 for value in lateness if value < 0),
        "lateness_ms": {
            "p50": percentile(lateness, 0.50),
            "p99": percentile(lateness, 0.99),
            "max": lateness[-1] if lateness else math.nan,
            "mean": statistics.fmean(lateness) if lateness else math.nan,
        },
        "runs_in_window": runs_in_window,
        "runs_per_second": runs_in_window / max(window_to - window_from, 1e-9),
        "cpu_us_per_run": measured["cpu_percent"] / 100 * (window_to - window_from) / per_run * 1e6,
        "django_statements": django,
        "django_statements_per_run": (
            django_total / per_run if runs_in_window and config.database else None
        ),
        "server_statements_per_run": (
            counters.get("Questions", 0) / per_run if counters and runs_in_window else None
        ),
        "server_com_per_run": (
            {name: value / per_run for name, value in counters.items() if name != "Questions"}
            if counters and runs_in_window
            else None
        ),
        **{
            f"runs_by_rss_{when}": [
                sum(1 for _, start, _ in label_runs if start <= measured[f"rss_{when}_at"])
                for label_runs in runs.values()
            ]
            for when in ("start", "end")
        },
        "rss_per_task": None,
    }


def add_rss_per_task(results: list[dict], baselines: dict[str, int]) -> None:
    """Fill in RSS per task: (RSS - baseline RSS - the recording's bytes) / tasks, at the end
    of the window (``rss_per_task``) and at its start (``rss_per_task_at_start``)."""
    for result in results:
        key = result["system"] if result["system"] == "apscheduler" else result["database"]
        if "error" in result or result["tasks"] < RSS_FROM or key not in baselines:
            continue
        for when, name in (("end", "rss_per_task"), ("start", "rss_per_task_at_start")):
            each = [
                (rss - baselines[key] - RECORD_BYTES * runs) / result["tasks"]
                for rss, runs in zip(
                    result[f"rss_{when}_each"], result[f"runs_by_rss_{when}"], strict=True
                )
            ]
            result[f"{name}_each"] = each
            result[name] = statistics.fmean(each)


# -- the APScheduler worker ----------------------------------------------------------------------


def aps_worker() -> None:
    """Run APScheduler 3 with the tasks the environment asks for, until SIGTERM."""
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.cron import CronTrigger

    from benchmarks.e2e_project.recorder import record, write

    tasks = int(os.environ["BENCH_TASKS"])
    shape = os.environ["BENCH_SHAPE"]
    second = "*" if shape == "second" else os.environ["BENCH_MINUTE_SECOND"]

    def task(index: int) -> Callable[[], None]:
        def run() -> None:
            record(index, _time())

        return run

    scheduler = BackgroundScheduler(
        executors={"default": ThreadPoolExecutor(APS_THREADS)}, timezone=UTC
    )
    trigger = CronTrigger(second=second, timezone=UTC)
    for index in range(tasks):
        scheduler.add_job(task(index), trigger, id=f"bench.task{index:05d}")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    scheduler.start()
    print(READY["apscheduler"], flush=True)
    while not stop.wait(0.25):
        pass
    scheduler.shutdown(wait=False)
    write(os.environ["BENCH_RECORD_DIR"], os.environ["BENCH_LABEL"])
    sys.stdout.flush()
    os._exit(0)  # do not wait for the executor's threads


# -- the driver ----------------------------------------------------------------------------------


def plan(args: argparse.Namespace) -> list[Config]:
    """Return the configurations in order: for each N, every-second before same-minute (the
    first start-up of a configuration tells how early the burst of the second can come), and
    APScheduler next to ours."""
    configs = []
    for tasks in args.tasks:
        for shape in args.shapes:
            if "ours" in args.systems:
                configs += [Config("ours", db, tasks, shape) for db in args.databases]
            if "ours-unlocked" in args.systems and tasks <= UNLOCKED_MAX_TASKS:
                unlocked = [db for db in args.databases if db in UNLOCKED_DATABASES]
                configs += [Config("ours-unlocked", db, tasks, shape) for db in unlocked]
            if "apscheduler" in args.systems:
                configs.append(Config("apscheduler", None, tasks, shape))
    return configs


def run_all(args: argparse.Namespace, runner: Runner) -> tuple[list[dict], dict[str, int]]:
    results: list[dict] = []
    began = time.monotonic()
    configs = plan(args)
    for number, config in enumerate(configs, 1):
        try:
            result = runner.run(config, seconds=args.seconds, warmup=args.warmup)
        except Failed as exc:
            print(f"{config.title}, {config.tasks} tasks, {config.shape}: {exc}", file=sys.stderr)
            result = {**config.__dict__, "title": config.title, "error": str(exc)[:4000]}
        results.append(result)
        print(progress(number, len(configs), began, config, result), file=sys.stderr, flush=True)
    baselines: dict[str, int] = {}
    if any(t >= RSS_FROM for t in args.tasks):
        keys: list[tuple[str, str | None]] = [("ours", db) for db in args.databases]
        keys = [k for k in keys if "ours" in args.systems]
        if "apscheduler" in args.systems:
            keys.append(("apscheduler", None))
        for system, db in keys:
            config = Config(system, db, 1, "second")
            try:
                baseline = runner.run(config, seconds=3, warmup=args.warmup)
            except Failed as exc:
                print(f"RSS baseline {config.title}: {exc}", file=sys.stderr)
                continue
            # One process suffices; with several, take their mean.
            rss = baselines[db or system] = round(statistics.fmean(baseline["rss_end_each"]))
            print(
                f"RSS baseline {config.title} with 1 task: {rss / 2**20:.1f} MiB",
                file=sys.stderr,
                flush=True,
            )
        add_rss_per_task(results, baselines)
    return results, baselines


def progress(number: int, total: int, began: float, config: Config, result: dict) -> str:
    head = (
        f"[{time.monotonic() - began:5.0f} s] {number}/{total} {config.title:28} "
        f"{config.tasks:>6} {config.shape:6}"
    )
    if "error" in result:
        return f"{head} FAILED"
    late = result["lateness_ms"]
    return (
        f"{head} p50 {fmt_ms(late['p50'])} p99 {fmt_ms(late['p99'])} max {fmt_ms(late['max'])} "
        f"ms, missed {result['missed']}/{result['expected']}, dup {result['duplicates']}, "
        f"CPU {result['cpu_percent']:.0f} %, statements/run "
        f"{fmt_number(result['django_statements_per_run'])} "
        f"(server {fmt_number(result['server_statements_per_run'])})"
    )


def fmt_ms(value: float) -> str:
    if value is None or math.isnan(value):
        return "—"
    if value < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def fmt_number(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}"


def fmt_missed(result: dict) -> str:
    missed, expected = result["missed"], result["expected"]
    if missed == 0:
        return "0"
    return f"{missed:,} ({100 * missed / expected:.0f} %)"


SHAPE_TEXT = {"second": "every second", "minute": "same minute"}


def ordered(results: list[dict]) -> list[dict]:
    def key(result: dict) -> tuple:
        system = SYSTEMS.index(result["system"])
        database = DATABASES.index(result["database"]) if result["database"] else 0
        return (result["tasks"], SHAPES.index(result["shape"]), system, database)

    return sorted(results, key=key)


def aps_p99(results: list[dict], tasks: int, shape: str) -> float | None:
    for result in results:
        if (
            result["system"] == "apscheduler"
            and result["tasks"] == tasks
            and result["shape"] == shape
            and "error" not in result
        ):
            return result["lateness_ms"]["p99"]
    return None


def markdown_table(results: list[dict]) -> str:
    lines = [
        "| setup | tasks | due | p50 ms | p99 ms | max ms | p99 / APS p99 | missed | dup "
        "| CPU % | DB server CPU % | statements / run (server) | statements / run (Django) "
        "| RSS / task |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: |",
    ]
    for result in ordered(results):
        head = f"| {result['title']} | {result['tasks']:,} | {SHAPE_TEXT[result['shape']]} "
        if "error" in result:
            lines.append(head + "| failed: see the JSON |" + " |" * 11)
            continue
        late = result["lateness_ms"]
        reference = aps_p99(results, result["tasks"], result["shape"])
        ratio = (
            f"{late['p99'] / reference:.1f}"
            if reference and result["system"] != "apscheduler" and not math.isnan(late["p99"])
            else ""
        )
        rss = result.get("rss_per_task")
        lines.append(
            head + f"| {fmt_ms(late['p50'])} | {fmt_ms(late['p99'])} | {fmt_ms(late['max'])} "
            f"| {ratio} | {fmt_missed(result)} | {result['duplicates']:,} "
            f"| {result['cpu_percent']:.0f} | {fmt_number(result['server_cpu_percent'], 0)} "
            f"| {fmt_number(result['server_statements_per_run'])} "
            f"| {fmt_number(result['django_statements_per_run'])} "
            f"| {'—' if rss is None else f'{rss:,.0f} B'} |"
        )
    return "\n".join(lines)


KINDS = ("SELECT", "INSERT", "UPDATE", "DELETE")
SERVER_KINDS = {
    "Com_commit": "COMMIT",
    "Com_rollback": "ROLLBACK",
    "Com_begin": "BEGIN",
    "Com_set_option": "SET",
}


def statements_table(results: list[dict]) -> str:
    lines = [
        "| setup | tasks | due | Django: "
        + " | ".join(KINDS)
        + " | other | server: "
        + " | ".join(SERVER_KINDS.values())
        + " | other |",
        "| --- | ---: | --- |" + " ---: |" * (len(KINDS) + 2 + len(SERVER_KINDS)),
    ]
    for result in ordered(results):
        if "error" in result or result["system"] != "ours" or not result["runs_in_window"]:
            continue
        runs = result["runs_in_window"]
        django = result["django_statements"]
        cells = [f"{django.get(kind, 0) / runs:.2f}" for kind in KINDS]
        other = sum(n for verb, n in django.items() if verb not in KINDS)
        cells.append(f"{other / runs:.2f}")
        server = result["server_com_per_run"]
        cells += [f"{server.get(name, 0):.2f}" if server else "—" for name in SERVER_KINDS]
        if server:
            # Questions that no Com_* counter counts: connections' quits, pings.
            rest = result["server_statements_per_run"] - sum(server.values())
            cells.append(f"{rest:.2f}")
        else:
            cells.append("—")
        lines.append(
            f"| {result['title']} | {result['tasks']:,} | {SHAPE_TEXT[result['shape']]} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def goals(results: list[dict]) -> list[str]:
    """Return the goals of the end-to-end benchmark, each with what this run measured."""

    def find(database: str | None, tasks: int, shape: str, system: str = "ours") -> dict | None:
        for result in results:
            key = (result["system"], result["database"], result["tasks"], result["shape"])
            if key == (system, database, tasks, shape):
                return None if "error" in result else result
        return None

    lines = ["| goal | measured | met |", "| --- | --- | :---: |"]
    unlocked = find("sqlite", 1_000, "second", "ours-unlocked")
    reference = aps_p99(results, 1_000, "second")
    if unlocked is not None and reference is not None:
        p99 = unlocked["lateness_ms"]["p99"]
        met = unlocked["missed"] == 0 and p99 <= reference / 2
        lines.append(
            f"| {unlocked['title']}, 1,000 tasks every second: none missed, p99 ≤ half of "
            f"APScheduler's | missed {unlocked['missed']:,}, p99 {fmt_ms(p99)} ms vs "
            f"{fmt_ms(reference / 2)} ms | {'yes' if met else 'no'} |"
        )
    for database in ("mariadb", "postgresql"):
        result = find(database, 10_000, "second")
        if result is None:
            continue
        p99 = result["lateness_ms"]["p99"]
        share = result["missed"] / max(result.get("expected", 0) or 1, 1)
        met = share <= 0.01 and p99 <= 1_000
        lines.append(
            f"| {result['title']}, 10,000 tasks every second: at most 1 % missed, p99 ≤ 1 s "
            f"| missed {fmt_missed(result)}, p99 {fmt_ms(p99)} ms | {'yes' if met else 'no'} |"
        )
    for database, factor in (("mariadb", 1), ("postgresql", 1), ("sqlite", 2)):
        result = find(database, 1_000, "second")
        reference = aps_p99(results, 1_000, "second")
        if result is None or reference is None:
            continue
        p99 = result["lateness_ms"]["p99"]
        bound = "APScheduler's" if factor == 1 else f"{factor} x APScheduler's"
        met = result["missed"] == 0 and result["duplicates"] == 0 and p99 <= factor * reference
        lines.append(
            f"| {result['title']}, 1,000 tasks every second: 0 missed, 0 duplicates, p99 ≤ "
            f"{bound} | missed {result['missed']:,}, duplicates {result['duplicates']:,}, "
            f"p99 {fmt_ms(p99)} ms vs {fmt_ms(factor * reference)} ms | {'yes' if met else 'no'} |"
        )
    for database in ("mariadb", "postgresql"):
        result = find(database, 10_000, "minute")
        if result is None:
            continue
        p99 = result["lateness_ms"]["p99"]
        met = result["missed"] == 0 and p99 <= 1_000
        lines.append(
            f"| {result['title']}, 10,000 tasks at the same minute: p99 ≤ 1 s, none missed "
            f"| p99 {fmt_ms(p99)} ms, missed {result['missed']:,} | {'yes' if met else 'no'} |"
        )
    for result in ordered(results):
        if "error" in result or result["system"] != "ours" or result["shape"] != "second":
            continue
        # Each fire time: one executed firing (≤ 3 statements), one skip per other instance (≤ 1).
        bound = 3 + (result["instances"] - 1)
        value = result["server_statements_per_run"]
        which = "server"
        if value is None:
            value, which = result["django_statements_per_run"], "Django"
        if value is None or math.isnan(value):
            continue
        lines.append(
            f"| {result['title']}, {result['tasks']:,} tasks every second: statements per fire "
            f"time ≤ 3 + 1 per other instance = {bound} | {value:.1f} ({which}) "
            f"| {'yes' if value <= bound else 'no'} |"
        )
    for result in ordered(results):
        rss = result.get("rss_per_task")
        if result["system"] != "ours" or result["tasks"] < 10_000 or rss is None:
            continue
        theirs = find(None, result["tasks"], result["shape"], "apscheduler")
        aps_rss = theirs.get("rss_per_task") if theirs else None
        if aps_rss is None:
            continue
        lines.append(
            f"| {result['title']}, 10,000 tasks {SHAPE_TEXT[result['shape']]}: RSS per task ≤ "
            f"APScheduler's | {rss:,.0f} B vs {aps_rss:,.0f} B "
            f"| {'yes' if rss <= aps_rss else 'no'} |"
        )
    return lines if len(lines) > 2 else []


def machine_info() -> dict:
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = "unknown"
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "python": platform.python_version(),
        "django": metadata.version("django"),
        "apscheduler": metadata.version("apscheduler"),
        "commit": commit,
        "load_average_at_start": os.getloadavg(),
    }


def write_results(
    info: dict, args: argparse.Namespace, results: list[dict], baselines: dict, minutes: float
) -> str:
    load = ", ".join(f"{x:.1f}" for x in info["load_average_at_start"])
    loads = [r["load_average_after"][0] for r in results if "load_average_after" in r]
    load_range = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?"

    def bullet(text: str) -> str:
        return textwrap.fill(text, 100, initial_indent="- ", subsequent_indent="  ")

    def para(text: str) -> str:
        # Keep code spans on one line: wrap with their spaces hidden.
        parts = text.split("`")
        parts[1::2] = [part.replace(" ", "\0") for part in parts[1::2]]
        return textwrap.fill("`".join(parts), 100).replace("\0", " ")

    header = ["# End to end: `runscheduler` on real databases vs APScheduler 3", ""]
    if args.note:
        header += [para(f"**{args.note}**"), ""]
    lines = [
        *header,
        bullet(f"Date: {info['date']}; the run took {minutes:.1f} min."),
        bullet(
            f"Machine: {info['nproc']} CPUs, {info['cpu']}; 1-minute load average {load} at "
            f"start, {load_range} at the end of the configurations (the machine is shared; "
            "only figures of one run compare)."
        ),
        bullet(
            f"Python {info['python']}, Django {info['django']}, APScheduler {info['apscheduler']}; "
            f"django_scheduling at commit {info['commit']}."
        ),
        f"- Command: `{args.command}`",
        "",
        para(
            "**ours**: real `manage.py runscheduler` processes (settings "
            f"`benchmarks.e2e_project.settings`: {settings_line(args)}), a "
            "fresh database per configuration, MariaDB with durable commits "
            "(`innodb_flush_log_at_trx_commit = 1`) over loopback, SQLite a file in WAL mode. "
            "**APScheduler 3**: `BackgroundScheduler`, `ThreadPoolExecutor(10)`, in memory, "
            "nothing persisted; run alone like each of our configurations, just after them. "
            "*every second*: cron `* * * * * *` (APScheduler: `CronTrigger(second='*')`); "
            "*same minute*: every task at the same second of the minute, cron `S * * * * *` "
            "(S picked so that the burst comes after the warm-up; `--minute-second 0` makes it "
            "`0 * * * * *`)."
        ),
        "",
        para(
            f"Each task records `time.time()` first thing, and the fire time it serves "
            f"(`current_fire_time()`), in a per-thread array written out at exit. **Lateness** "
            f"= start minus the intended fire time, computed by the benchmark from the cron grid "
            f"(ours: the fire time the run serves, which must be on the grid; APScheduler: the "
            f"latest fire time at or before the start). *every second*: the fire times of "
            f"{args.seconds} s after a {args.warmup} s warm-up, served by the end of a drain "
            f"({DRAIN['ours']:.0f} s ours, {DRAIN['apscheduler']:.0f} s APScheduler); *same "
            f"minute*: the one burst, followed for {args.seconds} s. **missed** = intended fire "
            "times not served by then; **dup** = served more than once. **CPU** = user + system "
            "time of the scheduler processes / wall time, % of one core (all instances); "
            "**DB server CPU** the same for `mariadbd`. **Statements / run** = statements in "
            "the window / runs started in it, all instances: *server* = MariaDB's `Questions` "
            "(including `COMMIT` and autocommit `SET`s); *Django* = what Django's cursors sent "
            "(an `execute_wrapper`; no `BEGIN`/`COMMIT`). **RSS / task** = (RSS of a process "
            "with N tasks at the end of its window - RSS of one with 1 task - 24 B per recorded "
            f"run) / N, from {RSS_FROM:,} tasks. **p99 / APS p99**: against APScheduler's p99 "
            "in this run."
        ),
        "",
        markdown_table(results),
        "",
    ]
    goal_lines = goals(results)
    if goal_lines:
        lines += ["## Goals", "", *goal_lines, ""]
    lines += [
        "## Statements per run, by kind",
        "",
        para(
            "Django: the first word of each statement Django's cursors sent (*other*: mostly "
            "the `SET SESSION TRANSACTION ISOLATION LEVEL` of each new MariaDB connection). "
            "Server: MariaDB's `Com_*` counters for the statements Django's cursors do not "
            "show (`COMMIT`, `ROLLBACK`, `BEGIN`; `SET` counts Django's `SET`s and the "
            "driver's autocommit switches), and *other*: the `Questions` no `Com_*` counter "
            "counts (mostly each closing connection's quit)."
        ),
        "",
        statements_table(results),
        "",
        para(
            "Everything per configuration (per-instance CPU and RSS, every `Com_*` counter, "
            "start-up time, load averages, errors): `end_to_end.json`."
        ),
        "",
    ]
    text = "\n".join(lines)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "end_to_end.md").write_text(text)
    payload = {
        "machine": info,
        "command": args.command,
        "note": args.note,
        "history": not args.no_history,
        "rss_baselines": baselines,
        "results": results,
    }
    (RESULTS / "end_to_end.json").write_text(json.dumps(without_nan(payload), indent=2) + "\n")
    return text


def without_nan(value: Any) -> Any:
    """Return *value* with NaN turned into None, for strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_nan(item) for item in value]
    return value


def comma_list(choices: Sequence[str] | None, cast: Callable[[str], Any] = str):
    def parse(text: str) -> list:
        values = [cast(part.strip().replace("_", "")) for part in text.split(",") if part.strip()]
        if choices is not None:
            unknown = [v for v in values if v not in choices]
            if unknown:
                raise argparse.ArgumentTypeError(
                    f"unknown {', '.join(map(str, unknown))}; choose from {', '.join(choices)}"
                )
        return values

    return parse


def settings_line(args: argparse.Namespace) -> str:
    """What the results' header says of our schedulers' settings."""
    if args.no_history:
        return (
            '`SCHEDULING["HISTORY"] = False` (`--no-history`), the rest at its defaults: every '
            "task is locked, no history is kept and the pool has its default sizes and queue"
        )
    return (
        "`SCHEDULING` left at its defaults, so every task is locked, history is on and the "
        "pool has its default sizes and queue"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--databases",
        type=comma_list(DATABASES),
        default=["mariadb", "sqlite"],
        help="mariadb,sqlite[,postgresql]",
    )
    parser.add_argument("--tasks", type=comma_list(None, int), help="default 100,1000,10000")
    parser.add_argument("--shapes", type=comma_list(SHAPES), default=list(SHAPES))
    parser.add_argument("--systems", type=comma_list(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument("--seconds", type=int, help="window (default 15; quick 6)")
    parser.add_argument("--warmup", type=int, help="warm-up (default 5; quick 3)")
    parser.add_argument("--minute-second", default="auto", help="auto, or 0-59")
    parser.add_argument("--quick", action="store_true", help="N=100, short windows; prints only")
    parser.add_argument("--write", action="store_true", help="with --quick: write the results")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--note", default="", help="a line for the header of the results")
    parser.add_argument("--keep", action="store_true", help="keep logs and records")
    parser.add_argument(
        "--no-history", action="store_true", help="our schedulers with HISTORY = False"
    )
    parser.add_argument("--aps-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.minute_second != "auto" and not (
        args.minute_second.isdigit() and 0 <= int(args.minute_second) < 60
    ):
        parser.error("--minute-second is auto or a second, 0-59")
    args.tasks = args.tasks or list(QUICK_TASKS if args.quick else FULL_TASKS)
    if args.seconds is None:
        args.seconds = 6 if args.quick else 15
    if args.warmup is None:
        args.warmup = 3 if args.quick else 5
    if args.seconds < 1 or args.warmup < 1:
        parser.error("--seconds and --warmup are at least 1")
    shown = [
        a
        for a, before in zip(argv, ["", *argv], strict=False)
        if "--note" not in (a, before) and not a.startswith("--note=")
    ]
    args.command = " ".join(["python", "benchmarks/bench_end_to_end.py", *shown])
    return args


@contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt, so that the clean-up runs for it too."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if args.aps_worker:
        aps_worker()
        return
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    runner = Runner(args)
    began = time.monotonic()
    with interrupt_on_sigterm():
        try:
            results, baselines = run_all(args, runner)
        except KeyboardInterrupt:
            print("interrupted: child processes stopped, nothing written", file=sys.stderr)
            raise SystemExit(130) from None
        finally:
            cleanup()
            runner.close()
    minutes = (time.monotonic() - began) / 60
    if args.no_write or (args.quick and not args.write):
        print(markdown_table(results))
        print()
        print(statements_table(results))
    else:
        print(write_results(info, args, results, baselines, minutes))


if __name__ == "__main__":
    main()
