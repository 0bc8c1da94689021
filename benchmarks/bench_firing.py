"""Database cost of one firing: statements and wall time per executed and per skipped firing.

Runs the real firing path (``FiringPipeline.run``: lock, shared state, claim, history, release)
against MariaDB, PostgreSQL and SQLite, and measures a bare single-row ``UPDATE`` round trip in
the same run as the floor to compare with. Commits are durable on both servers.

    python benchmarks/bench_firing.py [--iterations N] [--output benchmarks/results/firing.md]

MariaDB and PostgreSQL: the throwaway servers of ``scripts/mariadb-test-server`` and
``scripts/postgres-test-server`` (started when needed), or ``BENCH_MYSQL_URL`` and
``BENCH_POSTGRES_URL``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
T0 = datetime(2030, 1, 1, tzinfo=UTC)
WORKERS = ("mysql", "postgresql", "sqlite")
TITLES = {
    "mysql": "MariaDB (`innodb_flush_log_at_trx_commit = 1`)",
    "postgresql": "PostgreSQL (`synchronous_commit = on`)",
    "sqlite": "SQLite (file, rollback journal)",
}


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor == "postgresql":
        # The test server trades durability for speed; measure with durable commits.
        connection.settings_dict["OPTIONS"]["options"] = "-c synchronous_commit=on"

    call_command("migrate", verbosity=0)


class Counter:
    """Count the statements sent on a connection."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def measure(label: str, action, iterations: int, connection) -> dict:
    counter = Counter()
    times = []
    with connection.execute_wrapper(counter):
        for index in range(iterations):
            begun = time.perf_counter()
            action(index)
            times.append(time.perf_counter() - begun)
    return {
        "label": label,
        "statements": counter.count / iterations,
        "mean_ms": statistics.fmean(times) * 1000,
        "p50_ms": statistics.median(times) * 1000,
        "p99_ms": sorted(times)[int(len(times) * 0.99) - 1] * 1000,
    }


class Clock:
    """An injected clock: each firing gets the fire time it serves as "now"."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def run(iterations: int) -> tuple[str, list[dict]]:
    from django.db import connection

    from django_scheduling.models import ScheduledTask, TaskLock, TaskRun

    for model in (TaskRun, ScheduledTask, TaskLock):
        model.objects.all().delete()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on", "commits would not be durable"
    if connection.vendor != "mysql":
        return connection.vendor, measure_all(iterations)
    # The test server trades durability for speed; measure with durable commits.
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@GLOBAL.innodb_flush_log_at_trx_commit")
        (flush,) = cursor.fetchone()
        cursor.execute("SET GLOBAL innodb_flush_log_at_trx_commit = 1")
    try:
        return connection.vendor, measure_all(iterations)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"SET GLOBAL innodb_flush_log_at_trx_commit = {int(flush)}")


def measure_all(iterations: int) -> list[dict]:
    from django.db import connection

    from django_scheduling.conf import get_settings
    from django_scheduling.locking import DatabaseLockProvider, LockConfiguration
    from django_scheduling.models import TaskLock
    from django_scheduling.runtime.firing import FiringPipeline
    from django_scheduling.runtime.scheduler import Entry
    from django_scheduling.tasks.registry import TaskRegistry

    registry = TaskRegistry()

    def runner(name: str, clock: Clock) -> FiringPipeline:
        conf = dataclasses.replace(get_settings(), instance_name=name)
        return FiringPipeline(
            conf=conf, provider=DatabaseLockProvider(owner=name), default_zone=UTC, clock=clock
        )

    def entry(task_runner: FiringPipeline, name: str) -> Entry:
        definition = registry.add(lambda: None, fixed_rate="1s", name=name)
        (spec,) = task_runner.specs([definition], complete=False)
        return Entry(name, spec)

    results = []
    # An executed firing: a fresh fire time each iteration.
    clock_a = Clock()
    a = runner("bench-a", clock_a)
    executed = entry(a, "bench.executed")

    def execute(index: int) -> None:
        clock_a.now = T0 + timedelta(seconds=index)
        a.run(executed, clock_a.now)

    execute(-1)  # warm up: creates the lock row
    results.append(measure("executed firing", execute, iterations, connection))
    # The same with persistent connections: no connect per firing.
    connection.settings_dict["CONN_MAX_AGE"] = 60
    connection.close()
    results.append(
        measure(
            "executed firing, CONN_MAX_AGE=60",
            lambda index: execute(iterations + 10 + index),
            iterations,
            connection,
        )
    )
    connection.settings_dict["CONN_MAX_AGE"] = 0
    connection.close()

    # A firing another instance has already run: b takes the lock, finds it claimed, releases.
    clock_b = Clock()
    b = runner("bench-b", clock_b)
    claimed = entry(b, "bench.claimed")
    clock_a.now = T0 + timedelta(days=1)
    a.run(entry(a, "bench.claimed"), T0)
    results.append(
        measure("skipped firing: already run", lambda i: b.run(claimed, T0), iterations, connection)
    )

    # A firing whose lock another instance holds (it is running it right now).
    held = entry(b, "bench.held")
    holder = DatabaseLockProvider(owner="bench-holder").lock(LockConfiguration("bench.held", "1h"))
    assert holder is not None

    def locked(index: int) -> None:
        clock_b.now = T0 + timedelta(seconds=index)
        b.run(held, clock_b.now)

    results.append(measure("skipped firing: locked elsewhere", locked, iterations, connection))
    holder.unlock()

    # The floor: one autocommitted single-row UPDATE on a primary key, on an open connection.
    table = connection.ops.quote_name(TaskLock._meta.db_table)

    def bare_update(index: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET locked_by = %s WHERE name = %s", [f"x{index}", "bench.held"]
            )

    results.append(measure("bare single-row UPDATE", bare_update, iterations, connection))
    return results


def server_url(variable: str, script: str) -> str:
    """Return the URL of the database scheduling_bench on the server in *variable*, else on
    the test server that *script* starts."""
    if os.environ.get(variable):
        return os.environ[variable]
    server = ROOT / "scripts" / script
    subprocess.run([str(server), "start"], check=True)
    url = subprocess.run([str(server), "url"], check=True, capture_output=True, text=True)
    return url.stdout.strip().rsplit("/", 1)[0] + "/scheduling_bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "firing.md"))
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.worker == "mysql":
            url = server_url("BENCH_MYSQL_URL", "mariadb-test-server")
            import MySQLdb

            host_part = url.split("@", 1)[1]
            host, rest = host_part.split(":", 1)
            port, name = rest.split("/", 1)
            db = MySQLdb.connect(host=host, port=int(port), user="scheduling", passwd="scheduling")
            db.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {name} CHARACTER SET utf8mb4")
            db.close()
        elif args.worker == "postgresql":
            url = server_url("BENCH_POSTGRES_URL", "postgres-test-server")
            import psycopg

            server, name = url.rsplit("/", 1)
            with psycopg.connect(f"{server}/postgres", autocommit=True) as db:
                exists = "SELECT 1 FROM pg_database WHERE datname = %s"
                if not db.execute(exists, [name]).fetchone():
                    db.execute(f"CREATE DATABASE {name}")
        else:
            path = ROOT / "test-artifacts" / "bench-firing.sqlite3"
            path.parent.mkdir(exist_ok=True)
            path.unlink(missing_ok=True)
            url = f"sqlite:///{path}"
        setup_django(url)
        import json

        vendor, results = run(args.iterations)
        print(json.dumps({"vendor": vendor, "results": results}))
        return
    import json

    tables = []
    for worker in WORKERS:
        output = subprocess.run(
            [sys.executable, __file__, "--worker", worker, "--iterations", str(args.iterations)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        data = json.loads(output.strip().splitlines()[-1])
        tables.append(data)
    lines = [
        "# Database cost of a firing",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d} on {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, with `python benchmarks/bench_firing.py "
        f"--iterations {args.iterations}`. Each row is {args.iterations} firings through the "
        "real firing path (`FiringPipeline.run`) of a task that does nothing, in one thread, over "
        "loopback; the bare `UPDATE` is measured in the same run as the floor.",
        "",
    ]
    for data in tables:
        name = TITLES[data["vendor"]]
        floor = next(r for r in data["results"] if r["label"] == "bare single-row UPDATE")
        lines += [
            f"## {name}",
            "",
            "| what | statements | mean ms | p50 ms | p99 ms | x bare UPDATE (mean) |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in data["results"]:
            ratio = r["mean_ms"] / floor["mean_ms"]
            lines.append(
                f"| {r['label']} | {r['statements']:.1f} | {r['mean_ms']:.2f} | "
                f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {ratio:.1f} |"
            )
        lines.append("")
    Path(args.output).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
