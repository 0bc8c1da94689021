"""Suite-wide wiring: tests that only make sense on some databases are deselected on the others.

The suite runs once per database (``scripts/test`` runs the nox sessions); a test marked
``@pytest.mark.vendor("mysql")`` runs in the MariaDB session and is listed as deselected (never
skipped) in the others. A test marked ``@pytest.mark.secondary_database`` runs only when
``SECONDARY_DATABASE_URL`` configures the alias ``secondary``. A test marked
``@pytest.mark.sessions("6.1", "5.2/sqlite")`` runs only in those sessions of the matrix (a
Django version, optionally with a database) and is deselected in the others; with
``TEST_ALL_SESSIONS=1`` it runs everywhere.
"""

import os
import signal

import django
import pytest

# A suite started in the background by a non-interactive shell (``scripts/test &``, a CI
# runner) inherits SIGINT ignored, and so would every server it starts, which then could not be
# stopped with Ctrl-C as the tests do. Python's own handler here makes the children start with
# the default, as they do from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

VENDORS = {"mysql", "postgresql", "sqlite"}


def database_vendor(variable: str = "DATABASE_URL") -> str:
    """Return the vendor of the database in *variable*, as Django's ``connection.vendor``."""
    url = os.environ.get(variable, "sqlite://:memory:")
    if url.startswith(("mysql", "mariadb")):
        return "mysql"
    if url.startswith(("postgres", "pgsql")):
        return "postgresql"
    return "sqlite"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    vendor = database_vendor()
    secondary = bool(os.environ.get("SECONDARY_DATABASE_URL"))
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("vendor")
        if marker is not None and not set(marker.args) <= VENDORS:
            raise pytest.UsageError(
                f"{item.nodeid}: vendor{marker.args} names a database outside {sorted(VENDORS)}"
            )
        wrong_vendor = marker is not None and vendor not in marker.args
        no_secondary = item.get_closest_marker("secondary_database") is not None and not secondary
        sessions = item.get_closest_marker("sessions")
        other_session = sessions is not None and not _in_sessions(sessions.args, vendor)
        (drop if wrong_vendor or no_secondary or other_session else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _in_sessions(sessions: tuple[str, ...], vendor: str) -> bool:
    if os.environ.get("TEST_ALL_SESSIONS"):
        return True
    version = "{}.{}".format(*django.VERSION[:2])
    for session in sessions:
        wanted, _, database = session.partition("/")
        if wanted == version and database in ("", vendor):
            return True
    return False


@pytest.fixture(autouse=True)
def _run_events_end_with_their_test():
    """Deliver the run events a test published before the next test begins: a receiver that
    the next test connects must not hear them (a Celery test heard the previous test's
    ``run_enqueued`` of the same task name)."""
    yield
    from django_scheduling.observability.events import run_events

    run_events.drain(10)
