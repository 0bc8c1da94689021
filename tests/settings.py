"""Settings for the test suite.

``DATABASE_URL`` picks the database (default: SQLite); ``SECONDARY_DATABASE_URL``, when set, adds
the alias ``secondary`` and ``SCHEDULING_DATABASE`` may point the app at it. ``scripts/test``
runs the suite through nox on SQLite, MariaDB and PostgreSQL.
"""

import os
from importlib.util import find_spec
from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", BASE_DIR / "test-artifacts"))
ARTIFACTS.mkdir(parents=True, exist_ok=True)

env = environ.Env()

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_scheduling",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"
STATIC_URL = "static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]


def _database(url_variable: str, name: str) -> dict:
    """Return the settings of the database in *url_variable*; its test database is *name*."""
    database = env.db(url_variable, default="sqlite://:memory:")
    database["CONN_HEALTH_CHECKS"] = True
    engine = database["ENGINE"].rsplit(".", 1)[-1]
    if engine == "sqlite3":
        # A file, not memory, so that runscheduler processes started by the tests share it.
        database["TEST"] = {"NAME": str(ARTIFACTS / f"{name}.sqlite3")}
        database["OPTIONS"] = {"timeout": 30, "transaction_mode": "IMMEDIATE"}
    elif engine == "mysql":
        database.setdefault("OPTIONS", {})["charset"] = "utf8mb4"
        database["TEST"] = {
            "NAME": name,
            "CHARSET": "utf8mb4",
            "COLLATION": "utf8mb4_unicode_ci",
        }
    else:
        database["TEST"] = {"NAME": name}
    return database


DATABASES = {"default": _database("DATABASE_URL", f"test_scheduling_{os.getpid()}")}
if os.environ.get("SECONDARY_DATABASE_URL"):
    # A second database, for SCHEDULING["DATABASE"] = "secondary" while "default" is another.
    DATABASES["secondary"] = _database(
        "SECONDARY_DATABASE_URL", f"test_scheduling_secondary_{os.getpid()}"
    )

# The task engines of tests/test_engines*.py, where installed (nox installs them): django.tasks
# (Django 6; the django-tasks backport on 5.2) with django-tasks-db's DatabaseBackend, which
# keeps its table on "default".
if find_spec("django_tasks_db") is not None:
    if django.VERSION < (6, 0):
        INSTALLED_APPS.append("django_tasks")
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {
        "default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": []},
        "immediate": {
            "BACKEND": f"{'django.tasks' if django.VERSION >= (6, 0) else 'django_tasks'}"
            ".backends.immediate.ImmediateBackend"
        },
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
SCHEDULING = {
    # Only the tests that start server processes turn autostart on, through the environment.
    "AUTOSTART": env.bool("SCHEDULING_AUTOSTART", default=False),
    "SHUTDOWN_TIMEOUT": env("SCHEDULING_SHUTDOWN_TIMEOUT", default="30s"),
    "DATABASE": env("SCHEDULING_DATABASE", default="default"),
    # More keys for the processes a test starts, as JSON: '{"HOUSEKEEPING_INTERVAL": "2s"}'.
    **env.json("SCHEDULING_EXTRA", default={}),
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_scheduling": {
            "handlers": ["console"],
            "level": env("SCHEDULING_LOG_LEVEL", default="WARNING"),
        }
    },
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

if django.VERSION >= (6, 1):
    # Django 6.1 sends mail through MAILERS (without it, sending warns of a removal); the test
    # runner swaps each mailer for the locmem backend.
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend"}}
