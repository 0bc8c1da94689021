"""The modules that moved into subpackages in 0.1, importable at their old paths for one more
release, with a ``DeprecationWarning``.

``import django_scheduling.cron`` gives the module ``django_scheduling.schedules.cron`` itself:
one module object under two names, so that everything imported from either is the same. One
finder for every old path, rather than a file of re-exports at each: the package's top level
shows only its parts.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "install"]

#: Old module (under ``django_scheduling.``) -> its new place.
MOVED = {
    "cron": "schedules.cron",
    "triggers": "schedules.triggers",
    "durations": "schedules.durations",
    "decisions": "schedules.decisions",
    "timeline": "schedules.timeline",
    "registry": "tasks.registry",
    "engines": "tasks.engines",
    "state": "storage.task_rows",
    "history": "storage.history",
    "dbvalues": "storage.sql",
    "dbconnection": "storage.connections",
    "metrics": "observability.metrics",
    "alerts": "observability.alerts",
    "sentry_crons": "observability.sentry",
    "health": "observability.health",
    "monitoring": "observability.monitoring",
    "deadline": "observability.deadline",
    "autostart": "startup.autostart",
    "admin_views": "admin.views",
    "trends": "admin.trends",
    "charts": "admin.charts",
    "trends_admin": "admin.mixins",
    "scheduler": "runtime.scheduler",
    "pool": "runtime.pool",
    "keepalive": "runtime.keepalive",
    "writer": "runtime.writer",
    "outbox": "runtime.outbox",
    "maintenance": "runtime.maintenance",
    "service": "runtime.service",
    "execution": "runtime.firing",
}

_PACKAGE = "django_scheduling"
#: Removed in this release: the old paths go in 0.2.
REMOVED_IN = "0.2"


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Find a moved module at its old path, and load the module at its new one."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.partition(".")
        if package != _PACKAGE or name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = f"{_PACKAGE}.{MOVED[spec.name.partition('.')[2]]}"
        warnings.warn(
            f"{spec.name} has moved to {new}; the old path goes in django-scheduling "
            f"{REMOVED_IN}: import from {new}",
            DeprecationWarning,
            stacklevel=4,
        )
        module = importlib.import_module(new)
        # The import system gives the module the old path's spec: it keeps its own.
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # Loaded already, at its new path; its own spec back (relative imports read it).
        assert module.__spec__ is not None
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    """Let the old paths be imported (once per process)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
