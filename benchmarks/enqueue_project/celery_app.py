"""The Celery app of the enqueue benchmark: broker on ``BENCH_REDIS_URL``, Celery's defaults
otherwise (no result backend).

For ``BENCH_SYSTEM=beat`` it carries celery beat's schedule: ``BENCH_TASKS`` entries
``job_00000`` ..., each the task of that name every 1.0 s, as beat's documentation writes it.
Beat needs no Django: its processes run without ``DJANGO_SETTINGS_MODULE``.
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery("enqueue_bench")
app.conf.update(
    broker_url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:63799/0"),
    broker_connection_retry_on_startup=True,
)

if os.environ.get("BENCH_SYSTEM") == "beat":
    app.conf.beat_schedule = {
        f"job_{index:05d}": {"task": f"bench.job_{index:05d}", "schedule": 1.0}
        for index in range(int(os.environ.get("BENCH_TASKS", "0")))
    }
