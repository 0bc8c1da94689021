"""Tasks for the tests that start real processes. They are declared only when the environment
asks for them (``TESTAPP_TASKS=1``), so that the rest of the suite sees an empty registry."""

import os
import time

from django.utils import timezone

from django_scheduling import current_fire_time, scheduled, shutdown_requested

from .models import Execution


def record(name, seconds=0.0, *, stop_early=True):
    started = timezone.now()
    execution = Execution.objects.create(
        task=name, fire_time=current_fire_time(), pid=os.getpid(), started=started
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (stop_early and shutdown_requested()):
        time.sleep(0.02)
    Execution.objects.filter(pk=execution.pk).update(finished=timezone.now())


if os.environ.get("TESTAPP_TASKS"):
    SLOW = float(os.environ.get("TESTAPP_SLOW_SECONDS", "5"))

    @scheduled(cron="* * * * * *", name="every_second_cron")
    def every_second_cron():
        record("every_second_cron")

    @scheduled(fixed_rate="1s", name="every_second_rate")
    def every_second_rate():
        record("every_second_rate")

    @scheduled(fixed_delay="1s", name="every_second_delay")
    def every_second_delay():
        record("every_second_delay")

    @scheduled(fixed_rate="1s", name="slow", lock_at_most_for="3s")
    def slow():
        record("slow", SLOW)

    @scheduled(fixed_rate="1h", name="stubborn", lock_at_most_for="3s")
    def stubborn():
        record("stubborn", SLOW, stop_early=False)


from . import redeploy_tasks  # noqa: E402, F401  (its tasks are declared under TESTAPP_REDEPLOY=1)
