"""Settings for the process tests that start the project with a configuration mistake.

They are the suite's settings (``tests.settings``) with ``tests.configapp`` installed after
``django_scheduling``, changed through the environment:

- ``CONFIG_SCHEDULING``: the ``SCHEDULING`` setting as JSON, e.g. ``'{"CORE_POOL_SIZ": 8}'``;
- ``CONFIG_USE_TZ=0``: ``USE_TZ = False``;
- ``CONFIG_TASKS``: which tasks ``tests/configapp/tasks.py`` declares;
- ``CONFIG_READY_PROBE``: see ``tests/configapp/apps.py``.
"""

import json
import os

from .settings import *  # noqa: F403
from .settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.configapp"]

if "CONFIG_SCHEDULING" in os.environ:
    SCHEDULING = json.loads(os.environ["CONFIG_SCHEDULING"])
if os.environ.get("CONFIG_USE_TZ") == "0":
    USE_TZ = False

# The level name shows whether a line was logged at ERROR.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"levels": {"format": "%(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "levels"}},
    "loggers": {
        "django_scheduling": {
            "handlers": ["console"],
            "level": os.environ.get("SCHEDULING_LOG_LEVEL", "WARNING"),
        }
    },
}
