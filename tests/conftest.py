"""Suite-wide wiring: tests that only make sense on one database are deselected on the other.

``scripts/test`` runs the suite once per database; a test marked ``@pytest.mark.vendor("mysql")``
runs in the MariaDB pass and is listed as deselected (never skipped) in the SQLite pass.
"""

import os

import pytest


def database_vendor() -> str:
    url = os.environ.get("DATABASE_URL", "sqlite://:memory:")
    return "mysql" if url.startswith(("mysql", "mariadb")) else "sqlite"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    vendor = database_vendor()
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("vendor")
        (drop if marker is not None and vendor not in marker.args else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
