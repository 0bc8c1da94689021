"""Named locks shared by the instances of a project, in the style of ShedLock.

from django_scheduling.locking import DatabaseLockProvider, LockConfiguration

if (lock := DatabaseLockProvider().lock(LockConfiguration("report", "10m", "30s"))) is None:
    return  # held elsewhere
try:
    ...
finally:
    lock.unlock()
"""

from __future__ import annotations

import os
import threading
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ..conf import get_settings
from ..storage.errors import SUPPORTED_VENDORS
from .base import InvalidLockHandle, Lock, LockConfiguration, LockError, LockProvider
from .database import DatabaseLockProvider
from .memory import InMemoryLockProvider

__all__ = [
    "SUPPORTED_VENDORS",
    "DatabaseLockProvider",
    "InMemoryLockProvider",
    "InvalidLockHandle",
    "Lock",
    "LockConfiguration",
    "LockError",
    "LockProvider",
    "get_lock_provider",
]

_providers: dict[tuple[str, int], LockProvider] = {}
_providers_mutex = threading.Lock()


def get_lock_provider() -> LockProvider:
    """Return the provider ``SCHEDULING['LOCK_PROVIDER']`` selects, one per process."""
    kind = get_settings().lock_provider
    key = (kind, os.getpid())
    with _providers_mutex:
        if key not in _providers:
            if kind == "memory":
                _providers[key] = InMemoryLockProvider()
            else:
                _providers[key] = DatabaseLockProvider()
        return _providers[key]


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "SCHEDULING":
        with _providers_mutex:
            _providers.clear()
