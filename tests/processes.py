"""Start real ``manage.py`` / server processes against the test database, and watch them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import TestCase

from django.db import connections

ROOT = Path(__file__).resolve().parent.parent
FAKETIME = next(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"), None)


def database_url(alias: str = "default") -> str:
    """Return a DATABASE_URL that points at the database the tests use right now."""
    conn = connections[alias]
    settings = conn.settings_dict
    if conn.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    scheme = "postgres" if conn.vendor == "postgresql" else "mysql"
    return (
        f"{scheme}://{settings['USER']}:{settings['PASSWORD']}@{settings['HOST']}:"
        f"{settings['PORT']}/{settings['NAME']}"
    )


def skewed(offset: str) -> dict[str, str]:
    """Environment that shifts a process's wall clock by *offset* seconds ("+1.5", "-1")."""
    if FAKETIME is None:
        raise AssertionError("libfaketime is missing: apt-get install faketime")
    return {
        "LD_PRELOAD": str(FAKETIME),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def process_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=database_url(),
        PYTHONUNBUFFERED="1",
        TESTAPP_TASKS="1",
    )
    env.update(extra)
    return env


class Process:
    """A child process whose merged output is collected line by line in the background."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args, self.env = args, env
        self.popen = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """Wait until a line containing *text* appears; return it, or fail with the output."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (
                    self.popen.poll() is not None and not self._reader.is_alive()
                ):
                    raise AssertionError(
                        f"{text!r} did not appear in the output of {' '.join(self.args)}:\n"
                        + "\n".join(self.lines[-60:])
                    )
                self._changed.wait(min(remaining, 0.5))

    def count(self, text: str) -> int:
        with self._changed:
            return sum(text in line for line in self.lines)

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM the process and return its exit status."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{' '.join(self.args)} did not exit:\n{self.output}") from None
        self._reader.join(5)
        return code

    def kill(self) -> None:
        """SIGKILL the whole process group."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(10)


def manage(*args: str, env: dict[str, str] | None = None) -> Process:
    return Process([sys.executable, "manage.py", *args], env or process_env())


def start_schedulers(test: TestCase, count: int, env: dict[str, str]) -> list[Process]:
    """Start *count* ``runscheduler`` processes with *env*, killed when *test* ends; return
    them once each says it runs."""
    processes = [manage("runscheduler", env=env) for _ in range(count)]
    for process in processes:
        test.addCleanup(process.kill)
    for process in processes:
        process.wait_for("Scheduler running")
    return processes


def poll(predicate, timeout: float = 60.0, interval: float = 0.1, message: str = ""):
    """Call *predicate* until it returns a true value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message or "condition not met before the deadline")
        time.sleep(interval)


def db_worker(env: dict[str, str]) -> Process:
    """Start django-tasks-db's worker on every queue, polling often; wait until it runs."""
    args = ["db_worker", "--no-reload", "--no-startup-delay", "--queue-name", "*"]
    process = manage(*args, "--interval", "0.1", env=env)
    process.wait_for("Starting worker")
    return process


def celery_worker(name: str, queue: str, env: dict[str, str]) -> Process:
    """Start a Celery worker of tests/engines_celery.py on *queue*; wait until it is ready."""
    args = [sys.executable, "-m", "celery", "-A", "tests.engines_celery", "worker"]
    args += ["-P", "threads", "-c", "2", "-Q", queue, "-n", f"{name}@%h", "-l", "info"]
    args += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
    process = Process(args, env)
    process.wait_for("ready.")
    return process


class RedisServer:
    """A Redis server of a test's own, on a free port, that keeps its data in *directory* in
    an append-only file written at every write: its queues survive a stop and a start, as a
    production broker's do. The suite's shared server (``TEST_REDIS_URL``) is never stopped."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port)]
        args += ["--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", "always"]
        args += ["--save", "", "--daemonize", "no"]
        self.process = Process(args, dict(os.environ))
        self.process.wait_for("Ready to accept connections", timeout=30)

    def stop(self) -> None:
        """Stop the server cleanly (SIGTERM): it writes its data, then closes its connections."""
        assert self.process is not None
        code = self.process.stop(30)
        if code != 0:
            raise AssertionError(f"redis-server exited with {code}:\n{self.process.output}")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()


__all__ = [
    "Process",
    "RedisServer",
    "celery_worker",
    "database_url",
    "db_worker",
    "manage",
    "poll",
    "process_env",
    "skewed",
]
