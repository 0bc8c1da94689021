"""Tasks for the tests that start real processes. They are declared only when the environment
asks for them (``TESTAPP_TASKS=1``), so that the rest of the suite sees an empty registry."""

import os
import time

from django.utils import timezone

from django_scheduling import current_fire_time, schedulable, scheduled, shutdown_requested

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


def reports_with_arguments(*, full=False):
    """A plain function that a test names in SCHEDULING["SCHEDULE"]; what it returns is not
    kept (only a management command's output is)."""
    return f"report, full={full}"


@schedulable(name="record")
def record_stored(label: str) -> None:
    """What schedules in the database run in the tests: record the fire time served."""
    record(label)


if os.environ.get("TESTAPP_STORED"):
    # A code task far from its next firing, which a schedule in the database moves.
    @scheduled(cron="0 0 0 1 1 *", name="movable")
    def movable():
        record("movable")


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


# Tasks of tests/test_reliability_processes.py, each declared only when TESTAPP_RELIABILITY
# names it (a comma-separated list), so that a process runs only the task its test watches.
RELIABILITY = set(filter(None, os.environ.get("TESTAPP_RELIABILITY", "").split(",")))

if "frozen" in RELIABILITY:

    @scheduled(fixed_delay="1s", name="frozen", lock_at_most_for="2s")
    def frozen():
        record("frozen", 3)


if "back_to_back" in RELIABILITY:
    # Each run lasts as long as the period: the holder takes the lock again as soon as it
    # releases it, and holds it nearly all the time.
    @scheduled(fixed_rate="1s", name="back_to_back", lock_at_most_for="2s")
    def back_to_back():
        record("back_to_back", 1)


if "recovered" in RELIABILITY:

    @scheduled(fixed_rate="1h", name="recovered", lock_at_most_for="2s", recover=True)
    def recovered():
        record("recovered", 30)


if "not_recovered" in RELIABILITY:

    @scheduled(fixed_rate="1h", name="not_recovered", lock_at_most_for="2s")
    def not_recovered():
        record("not_recovered", 30)


if "dev_server" in RELIABILITY:
    # A task as most are written: it does not look at shutdown_requested().
    @scheduled(fixed_delay="1s", name="dev_server", lock_at_most_for="10m")
    def dev_server():
        record("dev_server", 3, stop_early=False)


from . import redeploy_tasks  # noqa: E402, F401  (its tasks are declared under TESTAPP_REDEPLOY=1)
