"""The trends in a real browser at a laptop's width: a task's run chart, the sparklines of the
task list and the timeline page.

Each test saves a screenshot to the test artifacts; with ``SCHEDULING_DOCS_SCREENSHOTS=1`` it
also writes the docs' pictures in ``docs/``.
"""

from __future__ import annotations

import math
import os
import shutil
from datetime import UTC, timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from selenium.webdriver.common.by import By

from django_scheduling.models import ScheduledTask, TaskRun
from django_scheduling.schedules import timeline
from django_scheduling.storage.task_rows import sync_tasks
from django_scheduling.tasks import registry as registry_module
from django_scheduling.tasks.registry import TaskRegistry

from .browser import BrowserTestCase

PASSWORD = "correct horse battery staple"
SCRIPT = "<script>alert(1)</script>"
NASTY = f"{SCRIPT}&co"
REPORT = "reports.tasks.build_daily_revenue_summary"
TASKS_URL = reverse("admin:django_scheduling_scheduledtask_changelist")
TIMELINE_URL = reverse("admin:django_scheduling_scheduledtask_timeline")
LAPTOP = 1280
DOCS = Path(__file__).resolve().parent.parent / "docs"


def job():
    pass


@pytest.mark.browser
class TrendsBrowserTests(BrowserTestCase):
    def setUp(self):
        super().setUp()
        User.objects.create_superuser("admin", "admin@example.com", PASSWORD)
        self.now = timezone.now().replace(microsecond=0)
        self.browser.set_window_size(LAPTOP, 900)

    def save(self, name: str) -> None:
        """Save a screenshot, and the docs' copy of it when asked to."""
        path = self.screenshot(name)
        if os.environ.get("SCHEDULING_DOCS_SCREENSHOTS") == "1":
            shutil.copyfile(path, DOCS / f"{name}.png")

    def declare(self, *declarations: tuple[str, dict]) -> None:
        """Declare tasks in code and give them rows, as a scheduler's start-up does."""
        tasks = TaskRegistry()
        for name, options in declarations:
            tasks.add(job, name=name, **options)
        patcher = mock.patch.object(registry_module, "registry", tasks)
        patcher.start()
        self.addCleanup(patcher.stop)
        sync_tasks(
            [(d.name, d.trigger(UTC)) for d in tasks], now=self.now, using="default", complete=False
        )

    def add_history(self, name: str, count: int, odd: dict[int, str] | None = None) -> dict:
        """Record *count* runs of *name*, every 15 minutes, with varied durations and outcomes
        (*odd*: the status of some, by index); return how many of each status, and how many
        started late."""
        if odd is None:
            odd = {17: "failed", 41: "interrupted", 58: "failed", 59: "failed", 73: "lost"}
            odd |= {88: "rejected", count - 1: "running"}
        counts: dict[str, int] = {"late": 0}
        for index in range(count):
            status = odd.get(index, "succeeded")
            counts[status] = counts.get(status, 0) + 1
            started = self.now - timedelta(minutes=15 * (count - index))
            late = timedelta(seconds=14) if index % 23 == 11 else timedelta(milliseconds=40)
            counts["late"] += late > timedelta(seconds=1)
            seconds = 1.2 + 0.7 * math.sin(index / 6) + (3.5 if status == "failed" else 0)
            duration = None if status in ("running", "lost") else timedelta(seconds=seconds)
            TaskRun.objects.create(
                task_name=name,
                started_at=started,
                scheduled_at=started - late,
                finished_at=started + duration if duration else None,
                duration=duration,
                status=status,
                instance="web-1:4242",
                error_type="ConnectionError" if status == "failed" else "",
                error_message="billing API unreachable" if status == "failed" else "",
            )
        return counts

    def test_a_task_page_charts_its_last_100_runs(self):
        self.declare((REPORT, {"cron": "0 */15 * * * *"}))
        counts = self.add_history(REPORT, 120)
        self.log_in("admin", PASSWORD)

        self.open(reverse("admin:django_scheduling_scheduledtask_change", args=[quote(REPORT)]))

        chart = self.wait_for("#ds-run-chart")
        self.assertTrue(chart.is_displayed())
        self.assertGreater(chart.rect["width"], 800)  # the width of the page's content
        # One round trip for the hundred bars: what each shows, as the browser lays it out.
        bars = self.browser.execute_script(
            """
            return [...arguments[0].querySelectorAll("rect.ds-bar")].map(bar => {
                const box = bar.getBoundingClientRect();
                return [bar.dataset.status, getComputedStyle(bar).fill, box.width, box.height];
            });
            """,
            chart,
        )
        self.assertEqual(len(bars), 100)
        self.assertTrue(all(width >= 3 and height >= 1 for _, _, width, height in bars))
        statuses = [status for status, _, _, _ in bars]
        self.assertEqual(statuses.count("failed"), 2)  # the first failure is among the 20 oldest
        self.assertEqual(statuses[-1], "running")
        colours = {status: fill for status, fill, _, _ in bars}
        self.assertEqual(colours["failed"], "rgb(220, 38, 38)")
        self.assertEqual(colours["succeeded"], "rgb(22, 163, 74)")
        late = chart.find_elements(By.CSS_SELECTOR, "polygon.ds-late")
        self.assertEqual(len(late), 4)  # of the newest 100 runs; all 120 have 5
        self.assertEqual(counts["late"], 5)
        title = late[0].find_element(By.TAG_NAME, "title").get_attribute("textContent")
        self.assertIn("started 14.00s late", title)
        self.assertEqual(self.browser.find_element(By.ID, "ds-consecutive-failures").text, "0")
        self.assertIn("%", self.browser.find_element(By.ID, "ds-success-rate").text)

        box = self.browser.find_element(By.ID, "ds-run-trends")
        self.browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", box)
        self.save("admin-task-chart")

    def test_the_task_list_shows_a_sparkline_per_task(self):
        self.declare(
            (REPORT, {"cron": "0 */15 * * * *"}),
            ("billing.send_invoices", {"cron": "0 */15 * * * *"}),
            ("cache.refresh", {"fixed_rate": "5m"}),
        )
        ScheduledTask.objects.update(next_fire_time=self.now + timedelta(minutes=4))
        self.add_history(REPORT, 30, {3: "failed", 12: "interrupted"})
        failing = {i: "failed" for i in range(14, 25)}
        self.add_history("billing.send_invoices", 25, {2: "failed", 7: "lost"} | failing)
        self.log_in("admin", PASSWORD)

        self.open(TASKS_URL)

        row = self.wait_for("#result_list").find_element(
            By.XPATH, "//tr[.//a[contains(., 'build_daily')]]"
        )
        line = row.find_element(By.CSS_SELECTOR, "svg.ds-sparkline")
        self.assertTrue(line.is_displayed())
        ticks = line.find_elements(By.CSS_SELECTOR, "rect.ds-tick")
        self.assertEqual(len(ticks), 20)
        self.assertTrue(all(tick.is_displayed() for tick in ticks))
        success = row.find_element(By.CSS_SELECTOR, ".ds-last-success")
        self.assertIn("ago", success.text)
        self.assertIn("last success: ", success.get_attribute("title"))
        self.save("admin-task-list-trends")

    def test_the_timeline_shows_the_next_24_hours(self):
        # Half past a minute: a task whose row is written on the very second of a fire time
        # (12:15:00) starts after it, and the day would hold one quarter hour fewer.
        self.now = self.now.replace(second=30)
        self.declare(
            ("billing.send_invoices", {"cron": "0 */15 * * * *"}),
            ("reports.hourly_kpis", {"cron": "0 0 * * * *"}),
            ("search.reindex", {"cron": "0 0 * * * *"}),
            ("backups.nightly", {"cron": "0 30 2 * * *"}),
            ("cache.refresh", {"fixed_rate": "20m"}),
            (NASTY, {"cron": "0 0 */6 * * *"}),
        )
        # 7 to 11 minutes from now, on a minute that is 2 past a multiple of 5: every 20 minutes
        # from there never meets the quarter hours, whatever the time the test runs at.
        offset = 7 + (2 - (self.now.minute + 7)) % 5
        ScheduledTask.objects.filter(name="cache.refresh").update(
            anchor=self.now + timedelta(minutes=offset)
        )
        # The page plans from the moment the rows were written: a quarter hour that passed in
        # between would be shown as due now, and again 24 hours on.
        plan = timeline.plan_firings
        patcher = mock.patch.object(
            timeline, "plan_firings", lambda plans, now: plan(plans, now=self.now)
        )
        patcher.start()
        self.addCleanup(patcher.stop)
        self.log_in("admin", PASSWORD)
        self.open(TASKS_URL)

        self.click_and_wait(self.wait_for("#ds-timeline-link"))

        strip = self.wait_for("#ds-timeline-strip")
        self.assertTrue(strip.is_displayed())
        self.assertGreater(strip.rect["width"], 800)
        slots = self.browser.execute_script(
            """
            return [...arguments[0].querySelectorAll("rect.ds-slot")].map(slot => {
                const box = slot.getBoundingClientRect();
                return [Number(slot.dataset.count), box.width, box.height];
            });
            """,
            strip,
        )
        self.assertTrue(all(width >= 2 and height >= 1 for _, width, height in slots))
        firings = sum(count for count, _, _ in slots)
        # 96 quarter hours, 24 hours twice, one night, 72 times 20 minutes, 4 times 6 hours.
        self.assertEqual(firings, 96 + 24 + 24 + 1 + 72 + 4)
        collisions = strip.find_elements(By.CSS_SELECTOR, "rect.ds-slot--collision")
        # Every hour three or four tasks at once, and the backup with the invoices at 02:30.
        self.assertEqual(len(collisions), 25)
        summary = self.browser.find_element(By.ID, "ds-timeline-summary").text
        self.assertIn("221 firings of 6 tasks", summary)
        busiest = self.browser.find_element(By.ID, "ds-busiest-minutes")
        self.assertIn(NASTY, busiest.text)  # shown as text, not run
        self.assertFalse(
            self.browser.execute_script(
                "return [...document.scripts].some(s => s.text.includes('alert(1)'))"
            )
        )
        self.save("admin-timeline")
