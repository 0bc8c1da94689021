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
from django.utils.module_loading import import_string

from ..conf import get_settings
from ..storage.errors import SUPPORTED_VENDORS
from .base import (
    BaseLockProvider,
    InvalidLockHandle,
    Lock,
    LockConfiguration,
    LockError,
    LockProvider,
)
from .database import DatabaseLockProvider
from .memory import InMemoryLockProvider

__all__ = [
    "PROVIDERS",
    "SUPPORTED_VENDORS",
    "BaseLockProvider",
    "DatabaseLockProvider",
    "InMemoryLockProvider",
    "InvalidLockHandle",
    "Lock",
    "LockConfiguration",
    "LockError",
    "LockProvider",
    "get_lock_provider",
    "provider_class",
]

#: The names ``SCHEDULING['LOCK_PROVIDER']`` accepts for the providers of the app; any other
#: value is the dotted path of a ``BaseLockProvider`` subclass.
PROVIDERS = {
    "database": "django_scheduling.locking.database.DatabaseLockProvider",
    "memory": "django_scheduling.locking.memory.InMemoryLockProvider",
}

_providers: dict[tuple[str, int], BaseLockProvider] = {}
_providers_mutex = threading.Lock()


def provider_class(setting: str) -> type[BaseLockProvider]:
    """Return the provider class that the value *setting* of ``LOCK_PROVIDER`` names; raise
    ``ImportError`` when it cannot be imported and ``TypeError`` when it is not a
    ``BaseLockProvider``."""
    found = import_string(PROVIDERS.get(setting, setting))
    if not (isinstance(found, type) and issubclass(found, BaseLockProvider)):
        raise TypeError(f"{setting!r} is not a subclass of BaseLockProvider")
    return found


def get_lock_provider() -> BaseLockProvider:
    """Return the provider ``SCHEDULING['LOCK_PROVIDER']`` selects, one per process."""
    setting = get_settings().lock_provider
    key = (setting, os.getpid())
    with _providers_mutex:
        if key not in _providers:
            _providers[key] = provider_class(setting)()
        return _providers[key]


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "SCHEDULING":
        with _providers_mutex:
            _providers.clear()
