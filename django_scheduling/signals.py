"""Signals sent around each run of a scheduled task.

Every signal is sent with ``sender`` set to the task's name (a string) and these keyword
arguments: ``task`` (the ``TaskDefinition``), ``scheduled_at`` (the fire time, ``None`` for a
manual run) and ``run`` (the ``TaskRun`` id, or ``None`` when history is off). ``run_succeeded``
adds ``duration``; ``run_failed`` adds ``exception`` and ``duration``; ``run_skipped`` adds
``reason`` (``"locked"``, ``"already run"``, ``"paused"``, ``"rejected"``, ``"database
unavailable"``, ``"trigger changed"``, ``"error"``).

``lock_lost`` is sent when a run's lock expired or was taken over by another instance while the
run went on (its process was frozen, or cut off from the database): ``run`` is that run and
``other_run`` the newer run that may have overlapped it (or ``None`` when not known).
"""

from django.dispatch import Signal

run_started = Signal()
run_succeeded = Signal()
run_failed = Signal()
run_skipped = Signal()
lock_lost = Signal()
