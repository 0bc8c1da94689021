"""Record when each task started and the fire time it served, and count database statements.

The recording must cost next to nothing next to a firing (a firing of the product costs a
millisecond or more; APScheduler's a few tens of microseconds): a task appends three floats
(task index, start time, fire time) to an ``array`` of its own thread (a new one every
1,024 records). That is about a microsecond, with no lock (each thread has its own buffer, so
nothing is shared but the list of buffers, appended to once per 1,024 records) and no I/O; 24
bytes per run. Everything is written out at exit, after the measurement.

Statements are counted by an ``execute_wrapper`` on every connection, per thread, by the
second they were sent in and their first word, so that the benchmark sums the seconds of its
window. It sees what Django's cursors send (not the driver's own ``BEGIN``/``COMMIT`` or
autocommit switches); MariaDB's server counters see those too.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["record", "count_statements", "write", "read_records"]

_time = time.time
_local = threading.local()
_buffers: list[array] = []
_counts: list[dict[tuple[int, str], int]] = []


#: Values per buffer: 1,024 records, 24 KiB.
CHUNK = 3 * 1024


def record(index: int, start: float, fire_time: float = math.nan) -> None:
    """Note that task *index* started at *start* (``time.time()``) serving *fire_time*."""
    try:
        buffer = _local.buffer
    except AttributeError:
        buffer = _new_buffer()
    buffer.extend((index, start, fire_time))
    if len(buffer) >= CHUNK:
        _new_buffer()


def _new_buffer() -> array:
    """Start a new buffer for this thread.

    A thread's records go into buffers of ``CHUNK`` values rather than one array that grows:
    growing one array to hundreds of kilobytes leaves its earlier copies free but resident in
    the thread's heap, memory that the benchmark would count against the scheduler, while it
    subtracts only the 24 bytes a run's record takes."""
    buffer = _local.buffer = array("d")
    _buffers.append(buffer)  # list.append holds the GIL throughout
    return buffer


def count_statements(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict
) -> Any:
    """An ``execute_wrapper`` that counts each statement by second and first word."""
    try:
        counts = _local.counts
    except AttributeError:
        counts = _local.counts = {}
        _counts.append(counts)
    key = (int(_time()), sql.lstrip()[:16].split(None, 1)[0].upper())
    counts[key] = counts.get(key, 0) + 1
    return execute(sql, params, many, context)


def write(directory: str | os.PathLike[str], label: str) -> None:
    """Write the runs and statement counts recorded so far to *directory*."""
    base = Path(directory) / f"{label}-{os.getpid()}"
    runs = array("d")
    for buffer in list(_buffers):
        # A thread may append while we copy: take whole records only.
        copy = buffer[:]
        runs.extend(copy[: len(copy) - len(copy) % 3])
    with open(f"{base}.runs", "wb") as stream:
        runs.tofile(stream)
    statements: dict[str, dict[str, int]] = {}
    for counts in list(_counts):
        for (second, verb), number in list(counts.items()):
            per_second = statements.setdefault(str(second), {})
            per_second[verb] = per_second.get(verb, 0) + number
    Path(f"{base}.statements.json").write_text(json.dumps(statements))


def read_records(path: Path) -> list[tuple[int, float, float]]:
    """Return the ``(index, start, fire_time)`` triples of one ``.runs`` file."""
    values = array("d")
    values.frombytes(path.read_bytes())
    return [(int(values[i]), values[i + 1], values[i + 2]) for i in range(0, len(values) - 2, 3)]
