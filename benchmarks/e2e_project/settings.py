"""Settings of the end-to-end benchmark: the product with its defaults, on ``DATABASE_URL``.

``SCHEDULING`` holds only ``HISTORY``, on unless ``BENCH_HISTORY=0`` (``--no-history``): every
task is locked and the pool has its default sizes, as in a project that only declares tasks.
The SQLite options are the example project's (WAL, ``IMMEDIATE`` transactions, a 20 s busy
timeout), what a project that runs several scheduler threads on one SQLite file needs.
``DEBUG`` is off, as in production: with it on, Django keeps every query in memory.
"""

from __future__ import annotations

import environ

env = environ.Env()

SECRET_KEY = "end-to-end-benchmark-only"
DEBUG = False
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_scheduling",
    "benchmarks.e2e_project.bench_tasks",
]

DATABASES = {"default": env.db("DATABASE_URL")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
elif DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SCHEDULING = {"HISTORY": env.bool("BENCH_HISTORY", default=True)}
