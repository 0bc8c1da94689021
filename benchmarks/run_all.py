"""Run every benchmark; each writes its figures to benchmarks/results/ (the docs quote them).

python benchmarks/run_all.py [--quick]

The enqueue benchmark runs in its nox session (``nox -s bench-enqueue``: Python 3.13 on PATH,
Django 6.1, Celery, django-crontask), the others with this interpreter.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

BENCHMARKS = {
    "cron": ["bench_cron.py"],
    "dispatch": ["bench_dispatch.py"],
    "firing": ["bench_firing.py"],
    "end_to_end": ["bench_end_to_end.py"],
    "memory": ["bench_memory.py"],
    "enqueue": ["-m", "nox", "-s", "bench-enqueue", "--"],
}
QUICK = {
    "cron": ["--quick"],
    "dispatch": ["--quick"],
    "firing": ["--iterations", "200"],
    "end_to_end": ["--quick"],
    "memory": ["--no-breakdown"],
    "enqueue": ["--quick"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke check")
    parser.add_argument("only", nargs="*", help=f"benchmarks to run: {', '.join(BENCHMARKS)}")
    args = parser.parse_args()
    unknown = set(args.only) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(sorted(unknown))}")
    for name, command in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        extra = QUICK[name] if args.quick else []
        print(f"== {name}", flush=True)
        begun = time.monotonic()
        if command[0].endswith(".py"):
            command = [str(HERE / command[0]), *command[1:]]
        subprocess.run([sys.executable, *command, *extra], cwd=HERE.parent, check=True)
        print(f"== {name} took {time.monotonic() - begun:.0f} s", flush=True)


if __name__ == "__main__":
    main()
