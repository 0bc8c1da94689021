"""While the scheduler starts a burst of firings, the threads that tidy up after runs wait.

At a busy instant the scheduler hands hundreds of claimed firings to its workers at once, and
they start them one after another. Each start is a little Python, so how late the last one
starts depends on how much of the GIL the workers get in those milliseconds. The threads that
only deal with what runs leave behind (the writer that records their ends and releases their
locks, the thread that delivers the run events) and the maintenance thread's pass would take
their share exactly then. So they ask ``bursts.wait()`` first: it returns once every burst
being started is taken up by the workers, and never later than ``WAIT_AT_MOST`` from the
call, nor than ``WAIT_AT_MOST`` after the latest burst began: bursts that follow each other
without a gap (a scheduler that cannot keep up) delay each pass of those threads by at most
that, and a burst that is never reported as started costs them one short wait, not a stall.

Measured with 1,000 ``lock=False`` tasks due every second on SQLite, one ``runscheduler``
(``benchmarks/bench_end_to_end.py``), seven runs each, one after the other: the p99 of the
delay from fire time to start had a median of 39.6 ms (18.5-53.7) without this wait, 26.5 ms
(18.1-41.8) with the writer and the run events waiting, and 18.6 ms (17.5-26.9) once the
maintenance pass waited too and the workers no longer queued on ``Underway``'s lock. A burst
takes about 17 ms to start; APScheduler's p99, in the same hour, was 40.6-55.1 ms.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

__all__ = ["WAIT_AT_MOST", "Burst", "Bursts", "bursts"]

#: The longest a burst holds up the threads that wait for it, in seconds.
WAIT_AT_MOST = 0.05


class Burst:
    """A burst being started; ``started()`` says its last firing was taken up (once counts,
    the calls after it change nothing)."""

    __slots__ = ("_bursts", "_open")

    def __init__(self, bursts: Bursts) -> None:
        self._bursts = bursts
        self._open = True

    def started(self) -> None:
        self._bursts._started(self)


class Bursts:
    """How many bursts are being started in this process, and a wait for them."""

    def __init__(
        self,
        wait_at_most: float = WAIT_AT_MOST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.wait_at_most = wait_at_most
        self.clock = clock
        self._cond = threading.Condition()
        self._starting = 0
        #: When the latest burst stops holding the waiters up, started or not (``clock()``).
        self._until = 0.0
        # A child process has none of its parent's bursts, nor its threads to start them.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._cond = threading.Condition()
        self._starting, self._until = 0, 0.0

    def begin(self) -> Burst:
        """Say that a burst of firings is being handed to the workers."""
        with self._cond:
            self._starting += 1
            self._until = self.clock() + self.wait_at_most
        return Burst(self)

    def _started(self, burst: Burst) -> None:
        with self._cond:
            if not burst._open:
                return
            burst._open = False
            self._starting -= 1
            if not self._starting:
                self._cond.notify_all()

    @property
    def starting(self) -> int:
        """How many bursts are being started."""
        with self._cond:
            return self._starting

    def wait(self) -> None:
        """Return once no burst is being started, and never later than ``wait_at_most`` from
        now (bursts that follow each other, as when the scheduler cannot keep up, must not
        hold a waiter for longer), nor than ``wait_at_most`` after the latest burst began (a
        burst never said started holds nobody for long)."""
        with self._cond:
            deadline = self.clock() + self.wait_at_most
            while self._starting:
                left = min(self._until, deadline) - self.clock()
                if left <= 0:
                    return
                self._cond.wait(left)


#: The bursts of this process: its schedulers begin them; the writer, the run events and the
#: maintenance thread wait for them.
bursts = Bursts()
