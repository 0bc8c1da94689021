"""Settings for the test suite.

``DATABASE_URL`` picks the database (default: SQLite). ``scripts/test`` runs the suite once on
SQLite and once on MariaDB.
"""

import os
from pathlib import Path

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

_sqlite_file = ARTIFACTS / f"test-{os.getpid()}.sqlite3"
DATABASES = {"default": env.db("DATABASE_URL", default="sqlite://:memory:")}
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not memory, so that runscheduler processes started by the tests share it.
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("TEST_SQLITE_NAME", str(_sqlite_file))}
    DATABASES["default"]["OPTIONS"] = {"timeout": 30, "transaction_mode": "IMMEDIATE"}
else:
    DATABASES["default"].setdefault("OPTIONS", {})["charset"] = "utf8mb4"
    DATABASES["default"]["TEST"] = {
        "NAME": os.environ.get("TEST_MYSQL_NAME", f"test_scheduling_{os.getpid()}"),
        "CHARSET": "utf8mb4",
        "COLLATION": "utf8mb4_unicode_ci",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
SCHEDULING = {
    # Only the tests that start server processes turn autostart on, through the environment.
    "AUTOSTART": env.bool("SCHEDULING_AUTOSTART", default=False),
    "SHUTDOWN_TIMEOUT": env("SCHEDULING_SHUTDOWN_TIMEOUT", default="30s"),
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
