"""Tasks for the observability tests that start real processes (``TASK_MODULE`` set to this
module's name): one that always succeeds, one that always fails."""

import os

from django_scheduling import scheduled

if os.environ.get("TESTAPP_OBSERVABILITY"):

    @scheduled(fixed_rate="1s", name="observed_ok")
    def observed_ok():
        pass

    @scheduled(fixed_rate="1s", name="observed_failing")
    def observed_failing():
        raise RuntimeError("observed failure")
