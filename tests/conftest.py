"""Suite-wide wiring: tests that only make sense on some databases are deselected on the others.

The suite runs once per database (``scripts/test`` runs the nox sessions); a test marked
``@pytest.mark.vendor("mysql")`` runs in the MariaDB session and is listed as deselected (never
skipped) in the others. A test marked ``@pytest.mark.secondary_database`` runs only when
``SECONDARY_DATABASE_URL`` configures the alias ``secondary``.
"""

import os

import pytest

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
        (drop if wrong_vendor or no_secondary else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
