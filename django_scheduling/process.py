"""Who this process is, and whether a process named that way on this host is still alive.

The default instance name is ``host:pid:start`` (*host* with its process-id namespace on Linux,
``web-1@4026531836``), *start* being the process's start time in
whole seconds since the epoch. Locks and runs carry it, so a restarted process can tell that
the holder of a lock was a process of this host that has died, and take the lock over at once
instead of waiting ``lock_at_most_for``. The start time guards against a reused pid.
"""

from __future__ import annotations

import os
import re
import socket
import time
from functools import cache

__all__ = ["INSTANCE_NAME", "identity", "is_dead_local", "hostname"]

#: The default instance name, ``host:pid:start``.
INSTANCE_NAME = re.compile(r"^(?P<host>.+):(?P<pid>\d+):(?P<start>\d+)$")


def hostname() -> str:
    """Return this host's name, with its process-id namespace when there is one: containers
    that share a host name (host networking) but not their pids never judge each other's."""
    name = socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return name
    return f"{name}@{''.join(c for c in namespace if c.isdigit())}"


@cache
def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def _stat(pid: int) -> list[str] | None:
    """Return the fields of /proc/*pid*/stat from field 3 (the state) on; None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """Return when process *pid* started, in whole seconds since the epoch; None if unknown."""
    boot, fields = _boot_time(), _stat(pid)
    if boot is None or fields is None:
        return None
    # Field 22 of stat(5) is the start time in clock ticks since boot.
    return int(boot + int(fields[19]) / os.sysconf("SC_CLK_TCK"))


def identity(pid: int | None = None) -> str:
    """Return ``host:pid:start`` for *pid* (this process by default)."""
    pid = os.getpid() if pid is None else pid
    started = start_time(pid)
    return f"{hostname()}:{pid}:{started if started is not None else int(time.time())}"


def is_dead_local(owner: str) -> bool:
    """Return whether *owner* names a process of this host that no longer runs.

    Only names in the default ``host:pid:start`` form can be told; any other name (a custom
    ``INSTANCE_NAME``) is never called dead.
    """
    match = INSTANCE_NAME.match(owner)
    if match is None or match["host"] != hostname():
        return False
    pid = int(match["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, under another user
    fields = _stat(pid)
    if fields is not None and fields[0] in ("Z", "X"):
        return True  # killed, not yet reaped by its parent
    started = start_time(pid)
    # The same pid started at another time is another process: the named one has died. A
    # second of tolerance absorbs the rounding of the start time.
    return started is not None and abs(started - int(match["start"])) > 1
