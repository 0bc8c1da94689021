"""Settings of the enqueue benchmark (benchmarks/bench_enqueue.py), on ``DATABASE_URL``.

Every system enqueues onto django-tasks-db's ``DatabaseBackend`` on this database, or onto
Celery on ``BENCH_REDIS_URL`` (benchmarks/enqueue_project/celery_app.py). ``SCHEDULING`` is not
set: the product's defaults. ``BENCH_SYSTEM`` says which system runs, and so which schedules
``jobs/tasks.py`` declares; ``crontask`` is installed only for django-crontask's runs.
"""

from __future__ import annotations

import os

import django
import environ

env = environ.Env()

SECRET_KEY = "enqueue-benchmark-only"
DEBUG = False
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_scheduling",
    "django_tasks_db",
    "benchmarks.enqueue_project.jobs",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.insert(-2, "django_tasks")  # the backport
if os.environ.get("BENCH_SYSTEM") == "crontask":
    INSTALLED_APPS.append("crontask")

DATABASES = {"default": env.db("DATABASE_URL")}
if "BENCH_CONN_MAX_AGE" in os.environ:  # bench_enqueue.py --conn-max-age; Django's default: 0
    DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ["BENCH_CONN_MAX_AGE"])
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": []}}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
