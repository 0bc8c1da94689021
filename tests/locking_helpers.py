"""Helpers for the lock provider tests: a fake clock, extra database aliases, the fuzz test, and
two programs run as separate processes: a counting worker (``python -m tests.locking_helpers
NAME N``) and a one-lock client (``python -m tests.locking_helpers locked_at LOCK``)."""

from __future__ import annotations

import copy
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

DEADLINE = 10.0  # seconds; only reached when a test is about to fail


class FakeClock:
    """An aware-UTC clock that moves only when told to."""

    def __init__(self, start: datetime = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def wait_until(predicate: Callable[[], bool], what: str, every: float = 0.005) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(every)


@contextmanager
def extra_database(test: Any, alias: str, **overrides: Any) -> Iterator[str]:
    """Add the alias *alias* for the running *test*: the test database's settings with
    *overrides* (``OPTIONS`` are merged, ``None`` removes one); remove it afterwards."""
    from django.db import connections

    settings = copy.deepcopy(connections["default"].settings_dict)
    options = {**settings.get("OPTIONS", {}), **overrides.pop("OPTIONS", {})}
    settings.update(overrides, OPTIONS={k: v for k, v in options.items() if v is not None})
    connections.settings[alias] = settings
    allowed = type(test).databases
    type(test).databases = allowed | {alias}  # Django's test case refuses unknown aliases
    try:
        yield alias
    finally:
        type(test).databases = allowed
        if hasattr(connections._connections, alias):
            connections[alias].close()
            del connections[alias]
        del connections.settings[alias]


def fuzz(
    make_provider: Callable[[], Any],
    *,
    iterations: int = 100,
    around: Callable[[], Any] | None = None,
) -> dict[str, int]:
    """Run ShedLock's fuzz test (A7) and return the counters.

    Eight threads share two locks, even threads ``lock1`` and odd ones ``lock2``; thread 0 runs
    a tenth of *iterations*, the others all of them. Each iteration reads a plain counter,
    sleeps 1 ms and writes it back plus one, under the lock, retrying until it gets the lock.
    *around*, if given, is a context manager each thread's whole loop runs in.
    """
    from django.db import connections

    from django_scheduling.locking import LockConfiguration

    counters = {"lock1": 0, "lock2": 0}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(index: int) -> None:
        name = "lock1" if index % 2 == 0 else "lock2"
        config = LockConfiguration(name, "5m", "5ms")
        provider = make_provider()
        todo = iterations // 10 if index == 0 else iterations
        try:
            start.wait()
            with around() if around else _nothing():
                while todo:
                    if (lock := provider.lock(config)) is None:
                        time.sleep(0)  # let the holder have the GIL back; not a wait
                        continue
                    try:
                        value = counters[name]
                        time.sleep(0.001)
                        counters[name] = value + 1
                        todo -= 1
                    finally:
                        lock.unlock()
        except BaseException as exc:
            errors.append(exc)
            start.abort()
        finally:
            getattr(provider, "close", lambda: None)()
            connections.close_all()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return counters


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def main(database_name: str, iterations: int) -> None:
    """Count *iterations* times, under the lock ``contended``, in the ``TaskLock`` row
    ``counter``; print ``ready``, wait for a line on stdin, count, then print the refusals."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django.db import connections

    from django_scheduling.locking import DatabaseLockProvider, LockConfiguration
    from django_scheduling.models import TaskLock

    connections["default"].settings_dict["NAME"] = database_name
    provider, config = DatabaseLockProvider(), LockConfiguration("contended", "1m")
    counter = TaskLock.objects.filter(name="counter")
    print("ready", flush=True)
    sys.stdin.readline()
    refused = 0
    for _ in range(iterations):
        while (lock := provider.lock(config)) is None:
            refused += 1
        try:
            value = int(counter.get().locked_by)
            time.sleep(0.002)
            counter.update(locked_by=str(value + 1))
        finally:
            lock.unlock()
    print(refused, flush=True)


def print_locked_at(name: str) -> None:
    """Take the lock *name* on the database of ``DATABASE_URL`` for a minute and print its
    ``locked_at``."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django_scheduling.locking import DatabaseLockProvider, LockConfiguration

    lock = DatabaseLockProvider(owner="locked-at").lock(LockConfiguration(name, "1m"))
    assert lock is not None, f"{name!r} is held"
    print(datetime.now(UTC).isoformat(), lock.locked_at.isoformat(), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "locked_at":
        print_locked_at(sys.argv[2])
    else:
        main(sys.argv[1], int(sys.argv[2]))
