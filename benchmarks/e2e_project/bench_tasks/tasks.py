"""``BENCH_TASKS`` tasks, each recording its start time and the fire time it serves.

``BENCH_SHAPE`` says when they are due: ``second``, every second (cron ``* * * * * *``), or
``minute``, all at the same second of every minute (cron ``S * * * * *``, S from
``BENCH_MINUTE_SECOND``, 0 by default: ``0 * * * * *``). ``BENCH_LOCK=0`` declares them with
``lock=False``. Every other option is the default: locked, history on.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

from django_scheduling import current_fire_time, scheduled

from ..recorder import record

SHAPES = {"second": "* * * * * *", "minute": "{second} * * * * *"}


def cron_expression(shape: str, second: int = 0) -> str:
    return SHAPES[shape].format(second=second)


def _task(index: int) -> Callable[[], None]:
    now = time.time

    def task() -> None:
        start = now()
        fire_time = current_fire_time()
        record(index, start, math.nan if fire_time is None else fire_time.timestamp())

    return task


CRON = cron_expression(
    os.environ.get("BENCH_SHAPE", "second"), int(os.environ.get("BENCH_MINUTE_SECOND", "0"))
)
LOCK = os.environ.get("BENCH_LOCK", "1") != "0"
for _index in range(int(os.environ.get("BENCH_TASKS", "0"))):
    scheduled(cron=CRON, name=f"bench.task{_index:05d}", lock=LOCK)(_task(_index))
