"""Signals sent around each run of a scheduled task.

Every signal is sent with ``sender`` set to the task's name (a string) and these keyword
arguments: ``task`` (the ``TaskDefinition``), ``scheduled_at`` (the fire time, ``None`` for a
manual run) and ``run`` (the ``TaskRun`` id, or ``None`` when history is off). ``run_succeeded``
adds ``duration``; ``run_failed`` adds ``exception`` and ``duration``; ``run_skipped`` adds
``reason`` (``"locked"``, ``"already run"``, ``"paused"``, ``"rejected"``, ``"database
unavailable"``, ``"trigger changed"``, ``"error"``).

``run_enqueued`` is sent when a firing of a django.tasks or Celery task has been handed to its
engine (after ``run_started``; see "Scaling out" in the README), and adds ``duration`` (of the
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

from django.dispatch import Signal

run_started = Signal()
run_succeeded = Signal()
run_failed = Signal()
run_skipped = Signal()
run_enqueued = Signal()
lock_lost = Signal()
task_failing = Signal()
