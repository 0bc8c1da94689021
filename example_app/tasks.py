"""What a project's tasks look like: ``django_scheduling`` imports this module at start."""

import logging
import random

from django.conf import settings
from django.contrib.auth import get_user_model

from django_scheduling import schedulable, scheduled, shutdown_requested

logger = logging.getLogger(__name__)


@scheduled(fixed_rate="5s")
def heartbeat():
    """Every 5 seconds, on one instance only (the default lock makes sure of it)."""
    logger.info("heartbeat: %d user(s)", get_user_model().objects.count())


@scheduled(cron="*/10 * * * * *")
def every_ten_seconds():
    """At seconds 0, 10, 20, ... of every minute (six-field cron, seconds first)."""
    logger.info("ten-second tick")


@scheduled(cron="0 3 * * *", zone="Europe/Berlin", lock_at_most_for="1h")
def nightly_cleanup():
    """At 03:00 Berlin time (five-field cron), whatever the server's zone; DST-safe."""
    logger.info("nightly clean-up")


@scheduled(fixed_delay="15s", initial_delay="2s")
def flaky_import():
    """15 seconds after the previous run ended. It fails now and then: failures are recorded
    in the history and the task keeps its schedule."""
    for _ in range(3):
        if shutdown_requested():
            return
    if random.random() < 0.3:
        raise RuntimeError("the upstream feed timed out")
    logger.info("imported the feed")


if "django_tasks_db" in settings.INSTALLED_APPS:
    try:
        from django.tasks import task
    except ImportError:  # Django 5.2: the django-tasks backport
        from django_tasks import task  # type: ignore[no-redef]

    @scheduled(fixed_rate="30s", kwargs={"audience": "staff"})
    @task()
    def send_digest(audience):
        """Every 30 seconds, enqueued on django.tasks instead of run in the scheduler: the
        history shows the run as "enqueued"; `manage.py db_worker` runs it."""
        logger.info("digest sent to %s", audience)


@schedulable
def remind_user(username, *, channel="mail"):
    """No schedule of its own: schedules kept in the database (the admin's Schedules) may run
    it, as ``example_app.tasks.remind_user``, with their own times and arguments."""
    logger.info("reminding %s by %s", username, channel)
