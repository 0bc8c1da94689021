"""A typed view of the ``SCHEDULING`` setting.

The setting is read the first time a value is needed, never at import, and read again after
``override_settings`` (or anything else that sends ``setting_changed``) touches it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from .durations import parse_duration

__all__ = ["SchedulingSettings", "get_settings", "DEFAULTS", "NAME_LENGTH"]

#: The longest task or lock name; the name columns have this length.
NAME_LENGTH = 200

DEFAULTS: dict[str, Any] = {
    "AUTOSTART": True,
    "TASK_MODULE": "tasks",
    "CORE_POOL_SIZE": 4,
    "MAX_POOL_SIZE": 16,
    "QUEUE_CAPACITY": 100,
    "KEEP_ALIVE": "60s",
    "REJECTION_POLICY": "abort",
    "SHUTDOWN_TIMEOUT": "30s",
    "LOCK_PROVIDER": "database",
    "LOCK_AT_MOST_FOR": "10m",
    "LOCK_AT_LEAST_FOR": "0s",
    "DATABASE": "default",
    "HISTORY": True,
    "HISTORY_RETENTION": "30d",
    "OVERDUE_AFTER": "1m",
    "MISFIRE_THRESHOLD": "5s",
    "INSTANCE_NAME": None,
    "HOUSEKEEPING_INTERVAL": "1m",
}

REJECTION_POLICIES = ("abort", "caller_runs", "discard", "discard_oldest")
LOCK_PROVIDERS = ("database", "memory")


@dataclass(frozen=True)
class SchedulingSettings:
    """The validated ``SCHEDULING`` setting, with every default filled in."""

    autostart: bool
    task_module: str
    core_pool_size: int
    max_pool_size: int
    queue_capacity: int
    keep_alive: timedelta
    rejection_policy: str
    shutdown_timeout: timedelta
    lock_provider: str
    lock_at_most_for: timedelta
    lock_at_least_for: timedelta
    database: str
    history: bool
    history_retention: timedelta
    overdue_after: timedelta
    misfire_threshold: timedelta
    instance_name: str
    housekeeping_interval: timedelta = timedelta(minutes=1)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> SchedulingSettings:
        """Validate *raw* (the user's ``SCHEDULING`` dict) and fill in the defaults."""
        raw = dict(raw or {})
        unknown = sorted(set(raw) - set(DEFAULTS))
        if unknown:
            raise ImproperlyConfigured(
                f"SCHEDULING has unknown key(s) {', '.join(unknown)}; "
                f"the keys are {', '.join(DEFAULTS)}"
            )
        values = {**DEFAULTS, **raw}

        def duration(key: str, *, allow_zero: bool = True) -> timedelta:
            try:
                return parse_duration(
                    values[key], name=f"SCHEDULING[{key!r}]", allow_zero=allow_zero
                )
            except ValueError as exc:
                raise ImproperlyConfigured(str(exc)) from None

        def integer(key: str, minimum: int) -> int:
            value = values[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ImproperlyConfigured(
                    f"SCHEDULING[{key!r}] must be a whole number of at least {minimum}, "
                    f"got {value!r}"
                )
            return value

        def choice(key: str, options: tuple[str, ...]) -> str:
            value = values[key]
            if value not in options:
                raise ImproperlyConfigured(
                    f"SCHEDULING[{key!r}] is {value!r}; use one of {', '.join(map(repr, options))}"
                )
            return value

        def boolean(key: str) -> bool:
            if not isinstance(values[key], bool):
                raise ImproperlyConfigured(
                    f"SCHEDULING[{key!r}] must be True or False, got {values[key]!r}"
                )
            return values[key]

        def text(key: str) -> str:
            if not isinstance(values[key], str) or not values[key]:
                raise ImproperlyConfigured(
                    f"SCHEDULING[{key!r}] must be a non-empty string, got {values[key]!r}"
                )
            return values[key]

        core, most = integer("CORE_POOL_SIZE", 0), integer("MAX_POOL_SIZE", 1)
        if most < core:
            raise ImproperlyConfigured(
                f"SCHEDULING['MAX_POOL_SIZE'] ({most}) is smaller than "
                f"SCHEDULING['CORE_POOL_SIZE'] ({core}); "
                "raise MAX_POOL_SIZE or lower CORE_POOL_SIZE"
            )
        at_most, at_least = (
            duration("LOCK_AT_MOST_FOR", allow_zero=False),
            duration("LOCK_AT_LEAST_FOR"),
        )
        if at_least > at_most:
            raise ImproperlyConfigured(
                f"SCHEDULING['LOCK_AT_LEAST_FOR'] ({values['LOCK_AT_LEAST_FOR']!r}) exceeds "
                f"SCHEDULING['LOCK_AT_MOST_FOR'] ({values['LOCK_AT_MOST_FOR']!r}); "
                "lower LOCK_AT_LEAST_FOR"
            )
        instance = values["INSTANCE_NAME"]
        if instance is not None and (not isinstance(instance, str) or not instance):
            raise ImproperlyConfigured(
                f"SCHEDULING['INSTANCE_NAME'] must be a non-empty string or None, got {instance!r}"
            )
        if instance is not None and len(instance) > 255:
            raise ImproperlyConfigured("SCHEDULING['INSTANCE_NAME'] is longer than 255 characters")
        return cls(
            autostart=boolean("AUTOSTART"),
            task_module=text("TASK_MODULE"),
            core_pool_size=core,
            max_pool_size=most,
            queue_capacity=integer("QUEUE_CAPACITY", 0),
            keep_alive=duration("KEEP_ALIVE"),
            rejection_policy=choice("REJECTION_POLICY", REJECTION_POLICIES),
            shutdown_timeout=duration("SHUTDOWN_TIMEOUT"),
            lock_provider=choice("LOCK_PROVIDER", LOCK_PROVIDERS),
            lock_at_most_for=at_most,
            lock_at_least_for=at_least,
            database=text("DATABASE"),
            history=boolean("HISTORY"),
            history_retention=duration("HISTORY_RETENTION", allow_zero=False),
            overdue_after=duration("OVERDUE_AFTER", allow_zero=False),
            misfire_threshold=duration("MISFIRE_THRESHOLD"),
            instance_name=instance or default_instance_name(),
            housekeeping_interval=duration("HOUSEKEEPING_INTERVAL", allow_zero=False),
        )


def default_instance_name() -> str:
    """Return ``host:pid:start`` for this process; it changes after a fork, as it should."""
    from .process import identity

    return identity()


_cached: SchedulingSettings | None = None
_cached_pid: int | None = None


def get_settings() -> SchedulingSettings:
    """Return the validated ``SCHEDULING`` setting, reading it on first use."""
    global _cached, _cached_pid
    if _cached is None or _cached_pid != os.getpid():
        _cached = SchedulingSettings.from_dict(getattr(django_settings, "SCHEDULING", None))
        _cached_pid = os.getpid()
    return _cached


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == "SCHEDULING":
        _cached = None
