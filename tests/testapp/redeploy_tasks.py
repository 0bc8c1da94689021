"""Tasks for the redeploy and outage process tests (tests/test_redeploy_and_outage_processes.py).

They are declared only under ``TESTAPP_REDEPLOY=1``, each only when the environment gives its
trigger, so that a test deploys a "new version" of a task by starting a process with another
value. Every call writes an ``Execution`` row with the fire time it serves.
"""

from __future__ import annotations

import os
import time
from datetime import datetime

from django.utils import timezone

from django_scheduling import current_fire_time, scheduled

from .models import Execution


def _record(name: str, seconds: float = 0.0, *, until: str | None = None) -> None:
    execution = Execution.objects.create(
        task=name, fire_time=current_fire_time(), pid=os.getpid(), started=timezone.now()
    )
    if seconds:
        time.sleep(seconds)  # the task's own work: it holds its lock this long
    if until:  # ... and then until the test creates the file *until* (60 s at most)
        deadline = time.monotonic() + 60
        while not os.path.exists(until) and time.monotonic() < deadline:
            time.sleep(0.05)
    Execution.objects.filter(pk=execution.pk).update(finished=timezone.now())


if os.environ.get("TESTAPP_REDEPLOY"):
    env = os.environ

    if cron := env.get("TESTAPP_CRON"):

        @scheduled(cron=cron, name="redeploy_cron")
        def redeploy_cron() -> None:
            _record("redeploy_cron")

    if cron := env.get("TESTAPP_RUN_ALL_CRON"):

        @scheduled(cron=cron, missed="run_all", name="redeploy_run_all")
        def redeploy_run_all() -> None:
            _record("redeploy_run_all")

    if cron := env.get("TESTAPP_ZONED_CRON"):

        @scheduled(cron=cron, zone=env["TESTAPP_CRON_ZONE"], name="redeploy_zoned")
        def redeploy_zoned() -> None:
            _record("redeploy_zoned")

    if at := env.get("TESTAPP_AT"):

        @scheduled(at=datetime.fromisoformat(at), name="redeploy_once")
        def redeploy_once() -> None:
            _record("redeploy_once")

    if cron := env.get("TESTAPP_COLOUR_CRON"):

        @scheduled(cron=cron, name="redeploy_colour")
        def redeploy_colour() -> None:
            _record("redeploy_colour")

    if delay := env.get("TESTAPP_DELAY"):

        @scheduled(fixed_delay=delay, name="redeploy_delay")
        def redeploy_delay() -> None:
            _record("redeploy_delay", until=env.get("TESTAPP_RELEASE"))

    @scheduled(fixed_rate="2s", lock=False, name="unlocked_every_2s")
    def unlocked_every_2s() -> None:
        _record("unlocked_every_2s")

    LONG_SECONDS = float(env.get("TESTAPP_LONG_SECONDS", "5"))

    @scheduled(fixed_rate="1h", name="long_hourly")
    def long_hourly() -> None:
        # The scheduled run holds the lock a while; a manual run ("run now") is quick.
        _record("long_hourly", LONG_SECONDS if current_fire_time() is not None else 0.0)
