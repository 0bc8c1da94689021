"""Start the scheduler from ``AppConfig.ready()`` in the processes that serve the project.

Serving processes are ``runserver``'s serving child (never its autoreloader parent) and the
workers of gunicorn, uwsgi, daphne, uvicorn, hypercorn, waitress and mod_wsgi. Every other
management command, scripts that call ``django.setup()``, and test runners never start it.
When the app is loaded in a master process that forks workers afterwards (gunicorn
``--preload``, uwsgi without ``lazy-apps``), the scheduler starts in each worker after the fork,
never in the master.

A mistake in the tasks or settings (what ``manage.py check`` reports) stops the scheduler, not
the process: it is logged at ERROR and the site keeps serving.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..checks import describe, scheduler_errors
from ..runtime.service import SchedulerService
from .argv import management_command, serving_mode

__all__ = ["maybe_autostart", "refused_because", "start_service"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_service = None
_service_pid: int | None = None
_refused: list[Any] = []
_refused_pid: int | None = None


def maybe_autostart() -> None:
    """Start the scheduler in this process when AUTOSTART is on and the process serves.

    Nothing here raises for a mistake in the settings or the tasks, and nothing reads the
    settings in a process that does not serve: ``check``, ``migrate`` and ``shell`` always run.
    """
    mode = serving_mode()
    if mode == "now":
        start_service()
    elif mode == "after_fork":
        _start_after_fork()


def _start_after_fork() -> None:
    if "uwsgi" in sys.modules:
        import uwsgi

        previous = getattr(uwsgi, "post_fork_hook", None)

        def hook() -> None:
            if previous is not None:
                previous()
            start_service()

        uwsgi.post_fork_hook = hook
        return
    master = os.getpid()

    def in_worker() -> None:
        # Only the master's own children are workers; a fork inside a worker is not.
        if os.getppid() == master:
            start_service()

    os.register_at_fork(after_in_child=in_worker)


def start_service() -> None:
    """Start this process's scheduler once; later calls in the same process do nothing.

    When AUTOSTART is off, do nothing. When the tasks or settings have mistakes, log them at
    ERROR and do not start: ``refused_because()`` returns them.
    """
    global _service, _service_pid, _refused, _refused_pid

    with _lock:
        pid = os.getpid()
        if (_service is not None and _service_pid == pid) or (_refused and _refused_pid == pid):
            return
        if not _autostart_setting():
            return
        errors = scheduler_errors()
        if errors:
            _refused, _refused_pid = errors, pid
            logger.error(
                "The scheduler is not starting in process %s; fix these first "
                "(manage.py check shows them too):\n%s",
                pid,
                describe(errors),
            )
            return
        try:
            service = SchedulerService()
            service.start_in_background()
        except ImproperlyConfigured as exc:  # a check that scheduler_errors() does not know
            _refused, _refused_pid = [exc], pid
            logger.error("The scheduler is not starting in process %s: %s", pid, exc)
            return
        _service, _service_pid = service, pid
    timeout = _exit_timeout()
    atexit.register(service.stop, timeout)
    if timeout == 0.0:
        _stop_on_interrupt(service.stop)
    logger.info("Scheduler autostarted in process %s", pid)


def _stop_on_interrupt(stop: Callable[[float], object]) -> None:
    """Start stopping the scheduler the moment Ctrl-C arrives, on a thread of its own, then
    interrupt as before.

    runserver's autoreloader kills its serving child a quarter of a second after Ctrl-C. The
    stop at exit (atexit) only begins once the main thread has unwound, and never when Python
    swallows the ``KeyboardInterrupt`` (raised inside a finalizer); begun here, it has that
    quarter of a second whatever the main thread does, and atexit waits for it.
    """
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set a signal handler
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        return  # SIGINT ignored (a server started with &) or left to the system: keep it so
    stopping = threading.Event()

    def interrupted(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():  # once: atexit's stop() waits for this one
            stopping.set()
            thread = threading.Thread(
                target=stop, args=(0.0,), name="scheduling-interrupt", daemon=True
            )
            with contextlib.suppress(RuntimeError):  # the interpreter is shutting down
                thread.start()
        previous(signum, frame)

    signal.signal(signal.SIGINT, interrupted)


def _autostart_setting() -> bool:
    """Return ``SCHEDULING['AUTOSTART']``; ``True`` when the setting cannot be read but does
    not turn it off, so that the mistake is logged where the scheduler would have run."""
    from django.conf import settings

    from ..conf import get_settings

    try:
        return get_settings().autostart
    except ImproperlyConfigured:
        raw = getattr(settings, "SCHEDULING", None)
        return not (isinstance(raw, Mapping) and raw.get("AUTOSTART") is False)


def refused_because() -> list[Any]:
    """Return why autostart did not start the scheduler in this process (the check messages);
    empty when it started it or was not asked to."""
    return list(_refused) if _refused_pid == os.getpid() else []


def _exit_timeout() -> float | None:
    """Return how long the scheduler may wait for running tasks when this process exits.

    runserver's autoreloader kills its serving child a quarter of a second after Ctrl-C, so
    there the scheduler does not wait: it marks the running runs interrupted and releases
    their locks at once, and a restarted dev server can run the tasks straight away.
    Elsewhere ``SHUTDOWN_TIMEOUT`` applies.
    """
    if management_command() == "runserver":
        return 0.0
    return None
