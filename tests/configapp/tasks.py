"""Tasks for the configuration process tests, chosen with ``CONFIG_TASKS``:

- ``invalid``: one valid task and one whose cron expression is wrong;
- ``listing``: a one-shot task, and two fixed-rate tasks that the tests pause or give a stored
  next fire time;
- ``misused``: one valid task and three declarations that misuse ``@scheduled``: ``timezone=``
  for ``zone=``, a bare ``@scheduled``, and ``cron=5``.
"""

import os
from datetime import UTC, datetime

from django_scheduling import scheduled

from ..testapp.tasks import record

TASKS = os.environ.get("CONFIG_TASKS", "")

if TASKS == "invalid":

    @scheduled(fixed_rate="1s", name="config.valid")
    def valid():
        record("config.valid")

    @scheduled(cron="0 0 25 * * *", name="config.bad_cron")
    def bad_cron():
        record("config.bad_cron")

elif TASKS == "listing":

    @scheduled(at=datetime(2026, 1, 1, 12, tzinfo=UTC), name="config.once")
    def once():
        record("config.once")

    @scheduled(fixed_rate="1h", name="config.hourly")
    def hourly():
        record("config.hourly")

    @scheduled(fixed_rate="1h", name="config.paused")
    def paused():
        record("config.paused")

elif TASKS == "misused":

    @scheduled(fixed_rate="1s", name="config.valid")
    def valid():
        record("config.valid")

    @scheduled(cron="0 0 3 * * *", timezone="Europe/Berlin", name="config.typo")
    def typo():
        record("config.typo")

    @scheduled
    def bare():
        record("config.bare")

    @scheduled(cron=5, name="config.number")
    def number():
        record("config.number")
