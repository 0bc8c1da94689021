"""Which process this is: a server's worker, runserver's serving child, a management command,
a test runner. Read from ``sys.argv`` and the modules loaded; nothing here starts anything."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Mapping

__all__ = ["management_command", "serving_mode"]

# Prefixes of the program's name: "waitress" covers waitress-serve and python -m waitress.
_SERVERS = ("gunicorn", "uwsgi", "daphne", "uvicorn", "hypercorn", "waitress")


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


def management_command(argv: list[str] | None = None) -> str | None:
    """Return the management command that this process runs, or ``None`` when it runs none
    (a server, a script, a test runner)."""
    argv = sys.argv if argv is None else argv
    if _program(argv) in ("pytest", "py.test"):
        return None
    return _management_command(argv)
