"""Settings of the example project, read from the environment with django-environ.

Every value has a default that runs on SQLite with nothing else installed. Set ``DATABASE_URL``
(e.g. ``mysql://user:password@127.0.0.1:3306/example``) to use another database.
"""

from importlib.util import find_spec
from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

SECRET_KEY = env("SECRET_KEY", default="example-project-insecure-key-change-me")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
TIME_ZONE = env("TIME_ZONE", default="UTC")
USE_TZ = True
USE_I18N = True
LANGUAGE_CODE = "en-us"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_scheduling",
    "example_app",
]

# Django's Tasks framework with its database backend (django-tasks-db; on Django 5.2 the
# django-tasks backport), installed by the "example" extra: example_app.tasks.send_digest is
# enqueued there, in the same SQLite file, and `manage.py db_worker` runs it. No other server.
if find_spec("django_tasks_db") and (django.VERSION >= (6, 0) or find_spec("django_tasks")):
    if django.VERSION < (6, 0):
        INSTALLED_APPS.append("django_tasks")
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'example.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several scheduler threads write to the file: wait for the write lock instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
elif DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SCHEDULING = {
    "AUTOSTART": env.bool("SCHEDULING_AUTOSTART", default=True),
    "CORE_POOL_SIZE": env.int("SCHEDULING_CORE_POOL_SIZE", default=4),
    "MAX_POOL_SIZE": env.int("SCHEDULING_MAX_POOL_SIZE", default=16),
    "LOCK_AT_MOST_FOR": env("SCHEDULING_LOCK_AT_MOST_FOR", default="10m"),
    "HISTORY_RETENTION": env("SCHEDULING_HISTORY_RETENTION", default="30d"),
    "OVERDUE_AFTER": env("SCHEDULING_OVERDUE_AFTER", default="1m"),
    # A management command on a schedule, without a wrapper function; its output is kept with
    # each run (see docs/tasks.md, "Schedules in settings and management commands").
    "SCHEDULE": {
        "sessions.clear": {"command": "clearsessions", "cron": "0 0 4 * * *"},
    },
    # The commands that schedules kept in the database (the admin's Schedules) may run.
    "COMMANDS": ["clearsessions"],
}

# The scheduler's lines and the tasks' own lines (example_app/tasks.py logs as
# "example_app.tasks"), with timestamps. Without a logger for the tasks, their INFO lines would
# be dropped: Python's default shows WARNING and above only.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"timestamped": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "timestamped"}},
    "loggers": {
        "django_scheduling": {
            "handlers": ["console"],
            "level": env("SCHEDULING_LOG_LEVEL", default="INFO"),
            "propagate": False,
        },
        "example_app": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
