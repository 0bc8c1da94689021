"""The project that ``benchmarks/bench_end_to_end.py`` runs ``manage.py runscheduler`` with.

``settings`` leaves ``SCHEDULING`` at its defaults; the ``bench_tasks`` app declares the tasks
(how many and when, from the environment) and writes what they recorded at exit;
``recorder`` is the recording itself, shared with the APScheduler worker.
"""
