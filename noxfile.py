"""The test matrix, run by ``scripts/test`` (``nox`` alone runs it too).

Django 6.1 on Python 3.13 runs the whole suite on SQLite, MariaDB and PostgreSQL. Django 5.2
LTS on Python 3.11 runs it on SQLite, but for the slowest process tests, and on MariaDB the
subset that goes through every database path (locks, history and the firing path) with the
schedulers of ``test_multi_instance.py``. Django 6.0 on Python 3.12 runs that subset on each of
the three databases.

    nox -l                                  # list the sessions
    nox -s "tests-6.1(postgresql)"          # one session
    nox -s tests-5.2 -- -k lock -x          # arguments after -- go to pytest

MariaDB and PostgreSQL: ``TEST_MYSQL_URL`` and ``TEST_POSTGRES_URL`` when set, else the throwaway
servers of ``scripts/mariadb-test-server`` and ``scripts/postgres-test-server``, started here if
they are not running. Redis (Celery's broker in tests/test_engines*.py): ``TEST_REDIS_URL``, else
``scripts/redis-test-server``. The sessions of one Django version share its virtualenv,
``.nox/django-X.Y``, installed by the first of them and again only when ``pyproject.toml`` or its
packages changed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).resolve().parent
#: Sessions run in the order they are listed, four at a time (``scripts/test``): Django 5.2,
#: then 6.1 (the whole suite), then the short Django 6.0 subset, which fills the gaps at the end.
EVERY_DATABASE = ["mysql", "postgresql", "sqlite"]
SUBSET = [
    "tests/test_locking_contract.py",
    "tests/test_history.py",
    "tests/test_execution.py",
    "tests/test_batches.py",
    "tests/test_pipeline.py",
    "tests/test_memory_layout.py",
    "tests/test_reliability.py",
    "tests/test_migrations.py",
]
SERVERS = {
    "mysql": ("TEST_MYSQL_URL", "scripts/mariadb-test-server"),
    "postgresql": ("TEST_POSTGRES_URL", "scripts/postgres-test-server"),
    "redis": ("TEST_REDIS_URL", "scripts/redis-test-server"),
}
# The task engines of tests/test_engines*.py: django.tasks (the backport on Django 5.2) with its
# database backend, and Celery on Redis.
ENGINES = {
    "5.2": ["django-tasks==0.12.0", "django-tasks-db==0.13.0", "celery[redis]>=5.4,<6"],
    "6.0": ["django-tasks-db==0.13.0", "celery[redis]>=5.4,<6"],
    "6.1": ["django-tasks-db==0.13.0", "celery[redis]>=5.4,<6"],
}
# A second database for the tests of SCHEDULING["DATABASE"] != "default" (tests/settings.py).
SECONDARY = {("6.1", "sqlite"): "postgresql", ("6.1", "postgresql"): "mysql"}


@nox.session(python="3.11", name="tests-5.2", venv_backend="none")
@nox.parametrize("database", ["mysql", "sqlite"], ids=["mysql", "sqlite"])
def tests_django_52(session: nox.Session, database: str) -> None:
    """Django 5.2 LTS: on SQLite the whole suite but the slowest process tests (their
    ``sessions`` marks); on MariaDB the database paths and the multi-instance schedulers."""
    if database == "sqlite":
        run_suite(session, "5.2", database)
    else:
        run_suite(session, "5.2", database, *SUBSET, "tests/test_multi_instance.py")


@nox.session(python="3.13", name="tests-6.1", venv_backend="none")
@nox.parametrize("database", EVERY_DATABASE, ids=EVERY_DATABASE)
def tests_django_61(session: nox.Session, database: str) -> None:
    """Django 6.1, the whole suite."""
    run_suite(session, "6.1", database)


@nox.session(python="3.12", name="tests-6.0", venv_backend="none")
@nox.parametrize("database", EVERY_DATABASE, ids=EVERY_DATABASE)
def tests_django_60(session: nox.Session, database: str) -> None:
    """Django 6.0, the database paths."""
    run_suite(session, "6.0", database, *SUBSET)


@nox.session(python="3.13", name="docs")
def docs(session: nox.Session) -> None:
    """The docs site, built with warnings (a broken link, a missing page) as errors."""
    session.install(".[docs]")
    site = Path(session.create_tmp()) / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site))


@nox.session(python="3.13", name="package")
def package(session: nox.Session) -> None:
    """The release: build the sdist and the wheel, check them (twine, check-wheel-contents),
    then install the wheel, not the checkout, in a fresh virtualenv for a smoke test."""
    session.install("build>=1.2", "twine>=6", "check-wheel-contents>=0.6")
    dist = Path(session.create_tmp()) / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist), ".")
    built = sorted(str(path) for path in dist.iterdir())
    session.run("twine", "check", "--strict", *built)
    (wheel,) = [path for path in built if path.endswith(".whl")]
    session.run("check-wheel-contents", wheel)
    python = shutil.which(f"python{session.python}") or "python3"
    session.run("scripts/wheel-smoke-test", wheel, python, external=True)


def run_suite(session: nox.Session, django: str, database: str, *paths: str) -> None:
    python = suite_python(session, django)
    env = {
        "DATABASE_URL": database_url(session, database),
        "TEST_REDIS_URL": database_url(session, "redis"),
    }
    if (secondary := SECONDARY.get((django, database))) is not None:
        env["SECONDARY_DATABASE_URL"] = database_url(session, secondary)
    session.run(python, "-m", "pytest", *paths, *session.posargs, env=env, external=True)


def suite_python(session: nox.Session, django: str) -> str:
    """Return the Python of the virtualenv of Django *django*, ``.nox/django-X.Y``: one for all
    the sessions of that version, created and installed here unless it already has the project
    with its test extras and the packages of that version.

    A session that finds another one installing it waits for it (a lock file beside it).
    """
    venv = ROOT / ".nox" / f"django-{django}"
    python = venv / "bin" / "python"
    packages = [f"Django~={django}.0", *ENGINES[django]]
    venv.parent.mkdir(exist_ok=True)
    with open(venv.parent / f"django-{django}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done, record = installed(venv, packages)
        if done:
            return str(python)
        interpreter = shutil.which(f"python{session.python}")
        if interpreter is None:
            session.error(f"python{session.python} is not on PATH (see scripts/test)")
        session.run(interpreter, "-m", "venv", "--clear", str(venv), external=True)
        session.run(
            str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
            "-e", ".[mysql,postgres,test]", *packages, external=True,
        )  # fmt: skip
        record()
    return str(python)


def installed(venv: Path, packages: list[str]) -> tuple[bool, Callable[[], object]]:
    """Return whether *venv* has the project and *packages* installed as they are now, and
    the call that records it once they are."""
    marker = venv / ".installed"
    wanted = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + " ".join(packages).encode()
    ).hexdigest()
    done = marker.exists() and marker.read_text() == wanted
    return done, lambda: marker.write_text(wanted)


def database_url(session: nox.Session, database: str) -> str:
    """Return the URL of *database* (or of the Redis server), starting its test server when
    needed."""
    if database == "sqlite":
        return "sqlite://:memory:"
    variable, script = SERVERS[database]
    if url := os.environ.get(variable):
        return url
    session.run(script, "start", external=True, silent=True)
    url = subprocess.run([script, "url"], cwd=ROOT, check=True, capture_output=True, text=True)
    return url.stdout.strip()


#: The enqueue benchmark's environment: every system it compares runs here (django-crontask
#: 2.0.1 needs Python >= 3.12 and Django >= 6.0; 2.1+ needs Python 3.14).
BENCH_ENQUEUE = [
    "Django~=6.1.0",
    "django-tasks-db==0.13.0",
    "celery[redis]>=5.4,<6",
    "django-crontask==2.0.1",
    "django-environ>=0.11",
]


@nox.session(python="3.13", name="bench-enqueue", default=False)
def bench_enqueue(session: nox.Session) -> None:
    """The enqueue benchmark, benchmarks/bench_enqueue.py (not run by plain ``nox``).

    ``nox -s bench-enqueue [-- options]``: every system it compares installs here.
    """
    done, record = installed(Path(session.virtualenv.location), BENCH_ENQUEUE)
    if not done:
        session.install("-e", ".[postgres]", *BENCH_ENQUEUE)
        record()
    session.run("python", "benchmarks/bench_enqueue.py", *session.posargs)
