"""The ``LOGGING`` that the README shows, and the example project's: the scheduler's lines and
the tasks' own lines both appear, with a timestamp."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import pytest
from django.test import SimpleTestCase

from .processes import ROOT, Process

TIMESTAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"

# Configure logging with the README's snippet, then log as the scheduler and as a task would.
LOG_WITH_THE_README_SNIPPET = r"""
import logging.config, re, sys
readme = open("README.md").read()
blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
[snippet] = [block for block in blocks if "LOGGING = {" in block]
namespace = {}
exec(snippet, namespace)
logging.config.dictConfig(namespace["LOGGING"])
logging.getLogger("django_scheduling.runtime.firing.invoke").info("Running myapp.tasks.report")
logging.getLogger("myapp.tasks").info("report sent to 3 people")
logging.getLogger("myapp.tasks").debug("not shown")
logging.getLogger("somelibrary").info("not shown either")
"""


class ReadmeLoggingTests(SimpleTestCase):
    def test_the_snippet_shows_scheduler_and_task_lines_with_timestamps(self):
        completed = subprocess.run(
            [sys.executable, "-c", LOG_WITH_THE_README_SNIPPET],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        self.assertEqual(completed.returncode, 0, completed.stderr)
        lines = completed.stderr.splitlines()
        self.assertEqual(len(lines), 2, completed.stderr)
        self.assertRegex(
            lines[0],
            rf"^{TIMESTAMP} INFO django_scheduling.runtime.firing.invoke: "
            r"Running myapp.tasks.report$",
        )
        self.assertRegex(lines[1], rf"^{TIMESTAMP} INFO myapp.tasks: report sent to 3 people$")


@pytest.mark.processes
class ExampleProjectLoggingTests(SimpleTestCase):
    def test_the_example_tasks_log_lines_appear(self):
        with TemporaryDirectory() as directory:
            env = {
                **{k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},
                "DJANGO_SETTINGS_MODULE": "example_project.settings",
                "DATABASE_URL": f"sqlite:///{Path(directory) / 'example.sqlite3'}",
                "PYTHONUNBUFFERED": "1",
            }
            manage = [sys.executable, "manage.py"]
            migrate = subprocess.run(
                [*manage, "migrate", "--noinput"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            self.assertEqual(migrate.returncode, 0, migrate.stderr)
            proc = Process([*manage, "runscheduler", "--task", "example_app.tasks.heartbeat"], env)
            try:
                task_line = proc.wait_for("heartbeat: ", timeout=30)
                scheduler_line = proc.wait_for("Scheduler started", timeout=30)
            finally:
                proc.stop(30)
        self.assertRegex(task_line, rf"^{TIMESTAMP} INFO example_app.tasks: heartbeat: 0 user")
        self.assertRegex(scheduler_line, rf"^{TIMESTAMP} INFO django_scheduling\.")
        self.assertIsNone(re.search("Traceback", proc.output), proc.output)


class ReadmeTests(SimpleTestCase):
    readme = (ROOT / "README.md").read_text()

    def test_images_have_absolute_links_that_show_on_pypi(self):
        links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", self.readme)
        self.assertTrue(links)
        for link in links:
            with self.subTest(link=link):
                self.assertRegex(
                    link, r"^https://github\.com/django-scheduling/django-scheduling/raw/main/docs/"
                )
                self.assertTrue((ROOT / link.partition("/raw/main/")[2]).is_file(), link)

    def test_uwsgi_needs_threads(self):
        section = self.readme.partition("## Where the scheduler runs")[2].partition("\n## ")[0]
        self.assertIn("enable-threads", section)
        self.assertIn("lazy-apps", section)
