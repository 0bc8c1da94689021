"""runscheduler lets glibc's malloc make at most two arenas, unless ``MALLOC_ARENA_MAX`` says.

Counted in real processes: threads that all hold memory at once, then glibc's own report of
its arenas (``malloc_info``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.test import SimpleTestCase

from django_scheduling.management.commands import runscheduler

from .processes import ROOT

#: Eight threads allocate (from malloc: more than Python's small objects) and wait for each
#: other, so that all hold an arena at once; then glibc says how many arenas it has.
CHILD = """
import ctypes, json, os, sys, tempfile, threading
import django
django.setup()
from django_scheduling.management.commands.runscheduler import _limit_malloc_arenas
limited = _limit_malloc_arenas() if sys.argv[1] == "limit" else None
together = threading.Barrier(9)
held = []
def allocate():
    held.append(bytearray(100_000))
    together.wait()
    together.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
together.wait()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fclose.argtypes = libc.malloc_info.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
with tempfile.NamedTemporaryFile() as report:
    stream = libc.fopen(report.name.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    arenas = open(report.name).read().count("<heap nr=")
together.wait()
print(json.dumps({"limited": limited, "arenas": arenas}))
"""


def arenas_of_child(how: str, **env: str) -> dict:
    child_env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    child_env.update(DJANGO_SETTINGS_MODULE="tests.settings", **env)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, how],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise AssertionError(f"the child failed:\n{done.stderr}")
    return json.loads(done.stdout)


class MallocArenaTests(SimpleTestCase):
    def test_threads_share_at_most_two_arenas(self):
        self.assertEqual(arenas_of_child("limit"), {"limited": True, "arenas": 2})

    def test_without_the_limit_each_thread_gets_an_arena_of_its_own(self):
        # What the limit saves: glibc's default, up to eight arenas per core.
        self.assertEqual(
            arenas_of_child("leave"), {"limited": None, "arenas": min(9, 8 * os.cpu_count())}
        )

    def test_malloc_arena_max_in_the_environment_decides(self):
        self.assertEqual(
            arenas_of_child("limit", MALLOC_ARENA_MAX="4"), {"limited": False, "arenas": 4}
        )

    def test_runscheduler_limits_the_arenas_before_the_scheduler_starts_its_threads(self):
        calls = []

        def start() -> None:
            calls.append("start")
            raise OperationalError("the database is down")

        service = mock.Mock()
        service.return_value.start.side_effect = start
        with (
            mock.patch.object(
                runscheduler, "_limit_malloc_arenas", side_effect=lambda: calls.append("limit")
            ),
            mock.patch.object(runscheduler, "SchedulerService", service),
            self.assertRaises(CommandError),
        ):
            call_command("runscheduler")
        self.assertEqual(calls, ["limit", "start"])
