"""Run every benchmark; each writes its figures to benchmarks/results/ (quoted by the README).

python benchmarks/run_all.py [--quick]
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
}
QUICK = {
    "cron": ["--quick"],
    "dispatch": ["--quick"],
    "firing": ["--iterations", "200"],
    "end_to_end": ["--quick"],
    "memory": ["--no-breakdown"],
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
        subprocess.run([sys.executable, str(HERE / command[0]), *extra], check=True)
        print(f"== {name} took {time.monotonic() - begun:.0f} s", flush=True)


if __name__ == "__main__":
    main()
