"""The run events: one fan-out, on a thread of its own, to the app's observers and to the public
signals.

Every run event (a run started, ended, was skipped, lost its lock; a task is failing) is
published here by the firing path and delivered, in the order published, on the
``scheduling-events`` thread: first to the app's own observers (metrics, Sentry Crons, failure
alerts: ``subscribe()``), each guarded, then to the receivers of the public signal, with
``send_robust``. So no observer holds up the path that runs tasks and releases their locks, and
no receiver that raises (``SystemExit`` included) stops the others or the thread. A thread
that dies anyway is started again by the next event. While the scheduler starts a burst of
firings, the thread waits a moment before it delivers (``bursts``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from django.core.signals import setting_changed
from django.db import close_old_connections
from django.dispatch import Signal

from ..bursts import bursts

__all__ = ["Active", "RunEvents", "run_events"]

logger = logging.getLogger(__name__)

Handler = Callable[..., object]
#: Whether an observer wants events (its setting is on). Asked once per signal, and again after
#: each change of the settings or of the observers: it must depend on the settings only.
Active = Callable[[], bool]


def _always() -> bool:
    return True


class RunEvents:
    """A queue of run events and the thread that delivers them."""

    def __init__(self, name: str = "scheduling-events") -> None:
        self.name = name
        self._observers: dict[Signal, list[tuple[Handler, Active]]] = {}
        self._queue: deque[tuple[Signal, str, dict[str, Any]]] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        #: Whether an active observer hears each signal (see ``_heard``), and the count of
        #: changes that made it unknown: a value found before a change is not kept after it.
        self._hearing: dict[Signal, bool] = {}
        self._changes = 0
        setting_changed.connect(self._forget_hearing)
        # After a fork the parent's thread is not in the child: the first event starts one.
        os.register_at_fork(after_in_child=self._forget_thread)

    def _forget_thread(self) -> None:
        self._thread, self._busy = None, False
        self._cond = threading.Condition()

    def subscribe(self, signal: Signal, handler: Handler, active: Active = _always) -> None:
        """Deliver *signal*'s events to *handler* (called as a receiver is: ``handler(sender,
        **kwargs)``), before the signal's receivers, while *active()* says so (an observer
        whose setting is off costs the firing path nothing); subscribing it again changes
        nothing. *active()* must depend on the settings only: its answer is kept until they
        change."""
        with self._cond:
            handlers = self._observers.setdefault(signal, [])
            if all(known is not handler for known, _ in handlers):
                handlers.append((handler, active))
        self._forget_hearing()

    def unsubscribe(self, signal: Signal, handler: Handler) -> None:
        with self._cond:
            handlers = self._observers.get(signal, [])
            handlers[:] = [(known, active) for known, active in handlers if known is not handler]
        self._forget_hearing()

    def _heard(self, signal: Signal) -> bool:
        """Whether an active observer hears *signal*. The answer is kept: asking each event
        cost the firing path a read of the settings per observer, and that read's check of
        the process id is a system call."""
        heard = self._hearing.get(signal)
        if heard is None:
            changes = self._changes
            heard = any(active() for _, active in self._observers.get(signal, ()))
            with self._cond:
                if changes == self._changes:
                    self._hearing[signal] = heard
        return heard

    # Connected to ``setting_changed`` after ``conf``'s own receiver (the package imports
    # ``conf`` first), so an answer read between the two cannot come from the old settings.
    def _forget_hearing(self, **kwargs: Any) -> None:
        with self._cond:
            self._changes += 1
            self._hearing = {}

    def publish(self, signal: Signal, sender: str, **kwargs: Any) -> None:
        """Queue an event of *signal* from *sender*; never waits on an observer. An event that
        no observer and no receiver would hear is not queued (a signal's receivers are only
        read here, never called)."""
        if not signal.receivers and not self._heard(signal):
            return
        with self._cond:
            was_empty = not self._queue
            self._queue.append((signal, sender, kwargs))
            self._ensure_thread()
            if was_empty:  # the thread waits only on an empty queue
                self._cond.notify()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every event published so far is delivered; return whether they were."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    @property
    def pending(self) -> int:
        """How many events wait to be delivered (those taken for delivery not counted)."""
        with self._cond:
            return len(self._queue)

    def _ensure_thread(self) -> None:
        # Called with the condition held.
        if self._thread is not None and self._thread.is_alive():
            return
        if self._thread is not None:
            logger.error("The %s thread had stopped; starting it again", self.name)
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: bool(self._queue))
                # Every event waiting, in one hold of the lock: a burst publishes thousands.
                events, self._queue = self._queue, deque()
                self._busy = True
                observers = {
                    signal: [handler for handler, active in handlers if active()]
                    for signal, handlers in self._observers.items()
                }
            bursts.wait()  # the workers first, while they start a burst
            for signal, sender, kwargs in events:
                self._deliver(observers.get(signal, []), signal, sender, kwargs)
            del events  # not kept while the thread waits
            # An observer or a receiver may have used the database (the failure alerts count
            # the failures in a row): this thread lives as long as the process, so it lets its
            # connections go as a request does, by CONN_MAX_AGE.
            try:
                close_old_connections()
            except Exception:
                logger.exception("Closing the %s thread's database connections failed", self.name)

    def _deliver(
        self, handlers: list[Handler], signal: Signal, sender: str, kwargs: dict[str, Any]
    ) -> None:
        for handler in handlers:
            try:
                handler(sender, signal=signal, **kwargs)
            except BaseException:  # an observer's failure is its own, never the others'
                logger.exception("The observer %r failed for %s", handler, sender)
        try:
            # send_robust logs each receiver's exception (logger django.dispatch).
            signal.send_robust(sender=sender, **kwargs)
        except BaseException:  # SystemExit from a receiver: send_robust catches Exception only
            logger.exception("A receiver of a run signal stopped it for %s", sender)


#: The run events of this process.
run_events = RunEvents()
