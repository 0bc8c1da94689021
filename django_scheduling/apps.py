from __future__ import annotations

from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "django_scheduling"
    verbose_name = "Scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, registry  # noqa: F401  (registers the system checks)

        registry.autodiscover()
        from .autostart import maybe_autostart

        maybe_autostart()
