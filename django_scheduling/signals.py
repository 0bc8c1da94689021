"""Signals sent around each run of a scheduled task.

Every signal is sent with ``sender`` set to the task's name (a string) and these keyword
arguments: ``task`` (the ``TaskDefinition``), ``scheduled_at`` (the fire time, ``None`` for a
manual run) and ``run`` (the ``TaskRun`` id, or ``None`` when history is off). ``run_succeeded``
adds ``duration``; ``run_failed`` adds ``exception`` and ``duration``; ``run_skipped`` adds
``reason`` (``"locked"``, ``"already run"``, ``"paused"``, ``"rejected"``, ``"database
unavailable"``, ``"trigger changed"``, ``"error"``).

``run_enqueued`` is sent when a firing of a django.tasks or Celery task has been handed to its
engine (after ``run_started``; see "Scaling out" in the docs), and adds ``duration`` (of the
enqueue), ``backend`` and ``result_id``. An enqueue that fails sends ``run_failed`` instead.
Neither says how the task's own run on a worker went.

``lock_lost`` is sent when a run's lock expired or was taken over by another instance while the
run went on (its process was frozen, or cut off from the database): ``run`` is that run and
``other_run`` the newer run that may have overlapped it (or ``None`` when not known).

``task_failing`` is sent, with ``SCHEDULING['ALERT_AFTER_FAILURES'] = N``, when a task's N-th
failure in a row ends and again when the first success after such a streak ends, with
``task``, ``failures`` (how many runs failed in a row), ``recovered`` (``False`` for the failing
task, ``True`` for the recovery), ``run`` (the run that made it) and ``exception`` (that run's
exception, ``None`` when recovered). See ``alerts``.
"""

from typing import Any

from django.dispatch import Signal

__all__ = [
    "lock_lost",
    "run_enqueued",
    "run_failed",
    "run_skipped",
    "run_started",
    "run_succeeded",
    "task_failing",
]


class _AnySender:
    """The receivers cache of a ``_RunSignal``: one entry, whatever the sender.

    It stands in for ``Signal.sender_receivers_cache``, which Django reads and fills with
    ``get(sender)`` and ``[sender] = ...`` and empties with ``clear()`` on every connect and
    disconnect. One entry is right for every sender as long as no receiver was connected for
    a particular sender; from the first that is, the cache stays empty and every send looks
    the receivers up again.
    """

    __slots__ = ("by_sender", "entry")

    def __init__(self) -> None:
        self.entry: Any = None
        self.by_sender = False

    def get(self, sender: Any, default: Any = None) -> Any:
        entry = self.entry
        return default if entry is None else entry

    def __setitem__(self, sender: Any, receivers: Any) -> None:
        if not self.by_sender:
            self.entry = receivers

    def clear(self) -> None:
        self.entry = None


class _RunSignal(Signal):
    """A Django ``Signal`` sent for a run, from many worker threads at once.

    A plain ``Signal()`` takes a lock of the whole signal on every ``send()`` to look up its
    receivers. Its cache, which avoids that, keeps the senders by weak reference, and ours
    are task names (strings), which cannot be. Under a burst the worker threads then queued
    on that lock: with six schedulers in one process and 1,000 tasks each due every second, a
    sixth of their threads' samples waited there. This one caches the receivers once for all
    senders.
    """

    def __init__(self) -> None:
        super().__init__(use_caching=True)
        self.sender_receivers_cache: Any = _AnySender()

    def connect(
        self, receiver: Any, sender: Any = None, weak: bool = True, dispatch_uid: Any = None
    ) -> None:
        if sender is not None:
            with self.lock:
                self.sender_receivers_cache.by_sender = True
        super().connect(receiver, sender=sender, weak=weak, dispatch_uid=dispatch_uid)


run_started = _RunSignal()
run_succeeded = _RunSignal()
run_failed = _RunSignal()
run_skipped = _RunSignal()
run_enqueued = _RunSignal()
lock_lost = _RunSignal()
task_failing = _RunSignal()
