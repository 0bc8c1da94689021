from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class SchedulingConfig(AppConfig):
    name = "django_scheduling"
    verbose_name = "Scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks
        from .models import Schedule
        from .observability import alerts, metrics, sentry
        from .startup.argv import management_command
        from .startup.autostart import maybe_autostart
        from .tasks import registry, stored

        checks.report_for(management_command())
        registry.autodiscover()
        Schedule.validator = stored.validate
        post_migrate.connect(_sync_after_migrate, sender=self)
        if _metrics_wanted():
            metrics.install()
        alerts.install()
        sentry.install()
        maybe_autostart()


def _metrics_wanted() -> bool:
    """``SCHEDULING["METRICS"]``: off by default, since each task's series cost memory."""
    from django.core.exceptions import ImproperlyConfigured

    from .conf import get_settings

    try:
        return get_settings().metrics
    except ImproperlyConfigured:
        return False  # the system checks report it


def _sync_after_migrate(*, using: str, **kwargs: Any) -> None:
    """Create the task rows on ``migrate``, so the admin lists the tasks before any run."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections
    from django.utils import timezone

    from .conf import get_settings
    from .models import Schedule, ScheduledTask
    from .runtime.database_schedules import DatabaseSchedules
    from .storage.task_rows import sync_tasks
    from .tasks.registry import registry

    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return  # the system checks report it
    if using != conf.database:
        return
    tables = connections[using].introspection.table_names()
    if ScheduledTask._meta.db_table not in tables:
        return  # migrated backwards
    zone = timezone.get_default_timezone()
    valid = [d for d in registry if d.error is None]
    if Schedule._meta.db_table in tables:
        # The code's tasks as the schedules in the database move them, and those schedules.
        valid = DatabaseSchedules(tasks=registry, conf=conf).load(valid)
    sync_tasks(
        [(d.name, d.trigger(zone)) for d in valid],
        now=timezone.now(),
        using=using,
        complete=not registry.errors(),
    )
