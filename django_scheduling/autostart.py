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
import traceback
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "maybe_autostart",
    "serving_mode",
    "management_command",
    "running_service",
    "refused_because",
]

logger = logging.getLogger(__name__)

# Prefixes of the program's name: "waitress" covers waitress-serve and python -m waitress.
_SERVERS = ("gunicorn", "uwsgi", "daphne", "uvicorn", "hypercorn", "waitress")
_lock = threading.Lock()
_service = None
_service_pid: int | None = None
_refused: list[Any] = []
_refused_pid: int | None = None


def serving_mode(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Return how this process serves: ``"now"`` (start here), ``"after_fork"`` (start in each
    forked worker) or ``"no"``."""
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    program = _program(argv)
    if "pytest" in sys.modules or program in ("pytest", "py.test"):
        return "no"
    command = _management_command(argv)
    if command is not None:
        if command != "runserver":
            return "no"
        # The autoreloader runs the server in a child with RUN_MAIN set; the parent only watches.
        if environ.get("RUN_MAIN") == "true" or "--noreload" in argv:
            return "now"
        return "no"
    if "uwsgi" in sys.modules or _importable_uwsgi():
        return _uwsgi_mode()
    if _is_server(program):
        if program.startswith("gunicorn") and _loading_in_gunicorn_master():
            return "after_fork"
        return "now"
    if "mod_wsgi" in sys.modules:
        return "now"
    return "no"


def _program(argv: list[str]) -> str:
    """Return the program's name; for ``python -m package``, the package's."""
    if not argv:
        return ""
    name = os.path.basename(argv[0])
    if name == "__main__.py":
        # ``python -m gunicorn`` sets argv[0] to the path of gunicorn/__main__.py.
        return os.path.basename(os.path.dirname(argv[0])) or name
    return name


def _is_server(program: str) -> bool:
    return any(program.startswith(server) for server in _SERVERS)


def _management_command(argv: list[str]) -> str | None:
    program = os.path.basename(argv[0]) if argv else ""
    if program == "__main__.py" and _is_server(_program(argv)):
        return None  # python -m gunicorn, unlike python -m django, is no management command
    if program in ("manage.py", "django-admin", "django-admin.py", "__main__.py") or (
        program.endswith(".py") and len(argv) > 1 and not argv[1].startswith("-")
    ):
        args = [a for a in argv[1:] if not a.startswith("-")]
        return args[0] if args else "help"
    return None


def _importable_uwsgi() -> bool:
    try:
        import uwsgi  # noqa: F401
    except ImportError:
        return False
    return True


def _uwsgi_mode() -> str:
    import uwsgi

    lazy = uwsgi.opt.get("lazy-apps") or uwsgi.opt.get("lazy")
    return "now" if lazy or uwsgi.worker_id() > 0 else "after_fork"


def _loading_in_gunicorn_master() -> bool:
    """Return whether gunicorn's arbiter is loading the app (``--preload``)."""
    files = [frame.filename.replace("\\", "/") for frame in traceback.extract_stack()]
    in_worker = any("/gunicorn/workers/" in name for name in files)
    in_arbiter = any(name.endswith("/gunicorn/arbiter.py") for name in files)
    return in_arbiter and not in_worker


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


def management_command(argv: list[str] | None = None) -> str | None:
    """Return the management command that this process runs, or ``None`` when it runs none
    (a server, a script, a test runner)."""
    argv = sys.argv if argv is None else argv
    if _program(argv) in ("pytest", "py.test"):
        return None
    return _management_command(argv)


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
    from .checks import describe, scheduler_errors
    from .service import SchedulerService

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

    from .conf import get_settings

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
    if _management_command(sys.argv) == "runserver":
        return 0.0
    return None


def running_service() -> object | None:
    """Return the scheduler service autostarted in this process, if any."""
    return _service if _service_pid == os.getpid() else None
