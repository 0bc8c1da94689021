"""Count every statement of every connection, and write the records out at exit."""

from __future__ import annotations

import atexit
import os
from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created

from .. import recorder


class BenchTasksConfig(AppConfig):
    name = "benchmarks.e2e_project.bench_tasks"
    label = "bench_tasks"

    def ready(self) -> None:
        connection_created.connect(_count_statements)
        directory = os.environ.get("BENCH_RECORD_DIR")
        if directory:
            label = os.environ.get("BENCH_LABEL", "scheduler")
            atexit.register(recorder.write, directory, label)


def _count_statements(*, connection: Any, **kwargs: Any) -> None:
    # The wrapper object outlives reconnections: install the counter once per wrapper.
    if recorder.count_statements not in connection.execute_wrappers:
        connection.execute_wrappers.append(recorder.count_statements)
