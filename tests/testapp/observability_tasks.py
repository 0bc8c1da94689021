"""Tasks for the observability tests that start real processes (``TASK_MODULE`` set to this
module's name), each declared only when ``TESTAPP_OBSERVABILITY`` (a comma-separated list)
names it:

- ``1``: one task that always succeeds, one that always fails;
- ``hang``, ``hang_timeout``: a task that hangs until the file ``TESTAPP_RELEASE_FILE``
  exists (or the scheduler stops), without and with ``timeout=``; it ignores
  ``cancel_requested()``, as a hung task would;
- ``flaky``: a task that fails its first two attempts at each fire time (``retries=2``).
"""

import os
import time

from django.utils import timezone

from django_scheduling import current_fire_time, scheduled, shutdown_requested

from .models import Execution

OBSERVED = set(filter(None, os.environ.get("TESTAPP_OBSERVABILITY", "").split(",")))
RELEASE = os.environ.get("TESTAPP_RELEASE_FILE", "")

if "1" in OBSERVED:

    @scheduled(fixed_rate="1s", name="observed_ok")
    def observed_ok():
        pass

    @scheduled(fixed_rate="1s", name="observed_failing")
    def observed_failing():
        raise RuntimeError("observed failure")


def hang(name: str) -> None:
    Execution.objects.create(
        task=name, fire_time=current_fire_time(), pid=os.getpid(), started=timezone.now()
    )
    while not os.path.exists(RELEASE) and not shutdown_requested():
        time.sleep(0.05)


if "hang" in OBSERVED:

    @scheduled(fixed_rate="2s", name="hangs")
    def hangs():
        hang("hangs")


if "hang_timeout" in OBSERVED:

    @scheduled(fixed_rate="2s", name="hangs_timeout", timeout="1s")
    def hangs_timeout():
        hang("hangs_timeout")


if "flaky" in OBSERVED:

    @scheduled(fixed_rate="1h", name="flaky", retries=2, retry_backoff="100ms")
    def flaky():
        fire_time = current_fire_time()
        attempt = Execution.objects.filter(task="flaky", fire_time=fire_time).count() + 1
        Execution.objects.create(
            task="flaky", fire_time=fire_time, pid=os.getpid(), started=timezone.now()
        )
        if attempt < 3:
            raise RuntimeError(f"attempt {attempt} fails")
