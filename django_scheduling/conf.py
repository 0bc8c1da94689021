"""A typed view of the ``SCHEDULING`` setting.

The setting is read the first time a value is needed, never at import, and read again after
``override_settings`` (or anything else that sends ``setting_changed``) touches it.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from .schedules.durations import parse_duration

__all__ = ["SchedulingSettings", "InvalidSettings", "get_settings", "DEFAULTS", "NAME_LENGTH"]

#: The longest task or lock name; the name columns have this length.
NAME_LENGTH = 200

DEFAULTS: dict[str, Any] = {
    "AUTOSTART": True,
    "TASK_MODULE": "tasks",
    "CORE_POOL_SIZE": 4,
    "MAX_POOL_SIZE": 16,
    "QUEUE_CAPACITY": None,
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
    "JITTER": "0s",
    "HEARTBEAT_INTERVAL": "30s",
    "HEALTH_TOKEN": None,
    "ALERT_AFTER_FAILURES": None,
    "ALERT_MAIL_ADMINS": False,
    "SENTRY_CRONS": False,
    "METRICS": False,
    "TIMEOUT": None,
    "SCHEDULE": {},
    "COMMANDS": [],
    "SCHEDULES_POLL_INTERVAL": "5s",
}

REJECTION_POLICIES = ("abort", "caller_runs", "discard", "discard_oldest")


@dataclass(frozen=True)
class SchedulingSettings:
    """The validated ``SCHEDULING`` setting, with every default filled in."""

    autostart: bool
    task_module: str
    core_pool_size: int
    max_pool_size: int
    queue_capacity: int | None
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
    jitter: timedelta = timedelta(0)
    heartbeat_interval: timedelta = timedelta(seconds=30)
    health_token: str | None = None
    alert_after_failures: int | None = None
    alert_mail_admins: bool = False
    sentry_crons: bool = False
    metrics: bool = False
    #: The default ``timeout=`` of tasks; None: no timeout.
    timeout: timedelta | None = None
    #: Tasks declared in settings, by name: each entry's ``task`` or ``command`` and the
    #: options of ``@scheduled`` (``tasks/configured.py`` reads the entries).
    schedule: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)
    #: The management commands that schedules in the database may run.
    commands: tuple[str, ...] = ()
    #: How often each scheduler reads the schedules in the database.
    schedules_poll_interval: timedelta = timedelta(seconds=5)

    @classmethod
    def from_dict(cls, raw: Any) -> SchedulingSettings:
        """Validate *raw* (the user's ``SCHEDULING`` dict) and fill in the defaults.

        Raise ``InvalidSettings`` naming every problem, not only the first.
        """
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise InvalidSettings([f"SCHEDULING must be a dict, got {raw!r}"])
        reader = _Reader({**DEFAULTS, **raw})
        problems = reader.problems
        problems += [_unknown_key(key) for key in raw if key not in DEFAULTS]

        core = reader.integer("CORE_POOL_SIZE", 0)
        most = reader.integer("MAX_POOL_SIZE", 1)
        if core is not None and most is not None and most < core:
            problems.append(
                f"SCHEDULING['MAX_POOL_SIZE'] ({most}) is smaller than "
                f"SCHEDULING['CORE_POOL_SIZE'] ({core}); "
                "raise MAX_POOL_SIZE or lower CORE_POOL_SIZE"
            )
        at_most = reader.duration("LOCK_AT_MOST_FOR", allow_zero=False)
        at_least = reader.duration("LOCK_AT_LEAST_FOR")
        if at_most is not None and at_least is not None and at_least > at_most:
            problems.append(
                f"SCHEDULING['LOCK_AT_LEAST_FOR'] ({reader.values['LOCK_AT_LEAST_FOR']!r}) "
                f"exceeds SCHEDULING['LOCK_AT_MOST_FOR'] "
                f"({reader.values['LOCK_AT_MOST_FOR']!r}); lower LOCK_AT_LEAST_FOR"
            )
        instance = reader.values["INSTANCE_NAME"]
        if instance is not None and (not isinstance(instance, str) or not instance):
            problems.append(
                f"SCHEDULING['INSTANCE_NAME'] must be a non-empty string or None, got {instance!r}"
            )
        elif instance is not None and len(instance) > 255:
            problems.append("SCHEDULING['INSTANCE_NAME'] is longer than 255 characters")
        if reader.values["SENTRY_CRONS"] is True and importlib.util.find_spec("sentry_sdk") is None:
            problems.append(
                "SCHEDULING['SENTRY_CRONS'] is True but sentry_sdk is not installed; install it "
                'with pip install "django-scheduling[sentry]"'
            )
        if (
            reader.values["METRICS"] is True
            and importlib.util.find_spec("prometheus_client") is None
        ):
            problems.append(
                "SCHEDULING['METRICS'] is True but prometheus_client is not installed; install "
                'it with pip install "django-scheduling[prometheus]"'
            )
        # Each value is None only when its problem was noted, and then nothing is built.
        fields: dict[str, Any] = {
            "autostart": reader.boolean("AUTOSTART"),
            "task_module": reader.text("TASK_MODULE"),
            "core_pool_size": core,
            "max_pool_size": most,
            "queue_capacity": reader.optional_integer("QUEUE_CAPACITY", 0),
            "keep_alive": reader.duration("KEEP_ALIVE"),
            "rejection_policy": reader.choice("REJECTION_POLICY", REJECTION_POLICIES),
            "shutdown_timeout": reader.duration("SHUTDOWN_TIMEOUT"),
            # "database", "memory" or a dotted path: the checks import it.
            "lock_provider": reader.text("LOCK_PROVIDER"),
            "lock_at_most_for": at_most,
            "lock_at_least_for": at_least,
            "database": reader.text("DATABASE"),
            "history": reader.boolean("HISTORY"),
            "history_retention": reader.duration("HISTORY_RETENTION", allow_zero=False),
            "overdue_after": reader.duration("OVERDUE_AFTER", allow_zero=False),
            "misfire_threshold": reader.duration("MISFIRE_THRESHOLD"),
            "instance_name": instance or default_instance_name(),
            "housekeeping_interval": reader.duration("HOUSEKEEPING_INTERVAL", allow_zero=False),
            "jitter": reader.duration("JITTER"),
            "heartbeat_interval": reader.duration("HEARTBEAT_INTERVAL", allow_zero=False),
            "health_token": reader.optional_text("HEALTH_TOKEN"),
            "alert_after_failures": reader.optional_integer(
                "ALERT_AFTER_FAILURES", 1, none_means="no alerts"
            ),
            "alert_mail_admins": reader.boolean("ALERT_MAIL_ADMINS"),
            "sentry_crons": reader.boolean("SENTRY_CRONS"),
            "metrics": reader.boolean("METRICS"),
            "timeout": reader.optional_duration("TIMEOUT"),
            "schedule": reader.schedule("SCHEDULE"),
            "commands": reader.names("COMMANDS"),
            "schedules_poll_interval": reader.duration("SCHEDULES_POLL_INTERVAL", allow_zero=False),
        }
        if problems:
            raise InvalidSettings(problems)
        return cls(**fields)


class InvalidSettings(ImproperlyConfigured):
    """The ``SCHEDULING`` setting is wrong; ``problems`` names each mistake in a sentence."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class _Reader:
    """Read the values of ``SCHEDULING`` one by one, noting each problem instead of raising."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.problems: list[str] = []

    def duration(self, key: str, *, allow_zero: bool = True) -> timedelta | None:
        try:
            name = f"SCHEDULING[{key!r}]"
            return parse_duration(self.values[key], name=name, allow_zero=allow_zero)
        except ValueError as exc:
            self.problems.append(str(exc))
            return None

    def optional_duration(self, key: str) -> timedelta | None:
        if self.values[key] is None:
            return None
        value = self.duration(key, allow_zero=False)
        if value is None:
            self.problems[-1] += ", or None for none"
        return value

    def integer(self, key: str, minimum: int) -> int | None:
        value = self.values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.problems.append(
                f"SCHEDULING[{key!r}] must be a whole number of at least {minimum}, got {value!r}"
            )
            return None
        return value

    def optional_integer(self, key: str, minimum: int, none_means: str = "no bound") -> int | None:
        if self.values[key] is None:
            return None
        value = self.integer(key, minimum)
        if value is None:
            self.problems[-1] += f", or None for {none_means}"
        return value

    def choice(self, key: str, options: tuple[str, ...]) -> str | None:
        value = self.values[key]
        if value not in options:
            self.problems.append(
                f"SCHEDULING[{key!r}] is {value!r}; use one of {', '.join(map(repr, options))}"
            )
            return None
        return value

    def boolean(self, key: str) -> bool | None:
        value = self.values[key]
        if not isinstance(value, bool):
            self.problems.append(f"SCHEDULING[{key!r}] must be True or False, got {value!r}")
            return None
        return value

    def optional_text(self, key: str) -> str | None:
        if self.values[key] is None:
            return None
        value = self.text(key)
        if value is None:
            self.problems[-1] += ", or None"
        return value

    def schedule(self, key: str) -> Mapping[str, Mapping[str, Any]] | None:
        """A dict of entries by task name, each a dict; what an entry holds is checked with
        the tasks, where a mistake names the entry."""
        value = self.values[key]
        if not isinstance(value, Mapping):
            self.problems.append(
                f"SCHEDULING[{key!r}] must be a dict of task names to entries, got {value!r}"
            )
            return None
        wrong = [name for name, entry in value.items() if not isinstance(name, str) or not name]
        wrong += [name for name, entry in value.items() if not isinstance(entry, Mapping)]
        if wrong:
            self.problems.append(
                f"SCHEDULING[{key!r}][{wrong[0]!r}] must be a non-empty name with a dict as its "
                "entry, e.g. {'command': 'clearsessions', 'cron': '0 0 4 * * *'}"
            )
            return None
        return value

    def names(self, key: str) -> tuple[str, ...] | None:
        """A list of non-empty strings (which of them exist is checked with the tasks)."""
        value = self.values[key]
        if not isinstance(value, list | tuple) or not all(
            isinstance(item, str) and item for item in value
        ):
            self.problems.append(
                f"SCHEDULING[{key!r}] must be a list of management command names, e.g. "
                f"['clearsessions'], got {value!r}"
            )
            return None
        return tuple(value)

    def text(self, key: str) -> str | None:
        value = self.values[key]
        if not isinstance(value, str) or not value:
            self.problems.append(f"SCHEDULING[{key!r}] must be a non-empty string, got {value!r}")
            return None
        return value


def _unknown_key(key: object) -> str:
    close = difflib.get_close_matches(str(key).upper(), DEFAULTS, n=1)
    if close:
        return f"SCHEDULING has an unknown key {key!r}; did you mean {close[0]!r}?"
    return f"SCHEDULING has an unknown key {key!r}; the keys are {', '.join(DEFAULTS)}"


def default_instance_name() -> str:
    """Return ``host:pid:start`` for this process; it changes after a fork, as it should."""
    from .process import identity

    return identity()


_cached: SchedulingSettings | None = None
_cached_pid: int | None = None
#: Bumped by every change of the setting: a thread that read the old value while it changed
#: must not cache it after the reset.
_generation = 0
_cache_lock = threading.Lock()


def get_settings() -> SchedulingSettings:
    """Return the validated ``SCHEDULING`` setting, reading it on first use."""
    global _cached, _cached_pid
    cached, pid = _cached, os.getpid()
    if cached is None or _cached_pid != pid:
        generation = _generation
        cached = SchedulingSettings.from_dict(getattr(django_settings, "SCHEDULING", None))
        with _cache_lock:
            if generation == _generation:
                _cached, _cached_pid = cached, pid
    return cached


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cached, _generation
    if setting == "SCHEDULING":
        with _cache_lock:
            _generation += 1
            _cached = None
