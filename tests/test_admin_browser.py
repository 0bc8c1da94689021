"""The admin pages in a real browser: overview, runs, errors, and the task controls."""

from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from django_scheduling.models import RunStatus, ScheduledTask, TaskRun

from .browser import BrowserTestCase

SCRIPT = "<script>alert(1)</script>"
PASSWORD = "correct horse battery staple"
OVERDUE = "billing.send_invoices"
DAILY = "reports.daily_summary"
FREQUENT = "cache.refresh"
TASKS_URL = reverse("admin:django_scheduling_scheduledtask_changelist")


def text(element: WebElement) -> str:
    """Return the element's text as written, before CSS transforms it (e.g. to upper case)."""
    return element.get_attribute("textContent").strip()


def task_url(name: str) -> str:
    return reverse("admin:django_scheduling_scheduledtask_change", args=[quote(name)])


@pytest.mark.browser
class AdminBrowserTests(BrowserTestCase):
    def setUp(self):
        super().setUp()
        User.objects.create_superuser("admin", "admin@example.com", PASSWORD)
        now = timezone.now()
        self.now = now
        ScheduledTask.objects.create(
            name=OVERDUE,
            kind="cron",
            trigger="cron 0 */15 * * * * UTC",
            next_fire_time=now - timedelta(minutes=20),
            last_fire_time=now - timedelta(minutes=35),
        )
        ScheduledTask.objects.create(
            name=DAILY,
            kind="cron",
            trigger="cron 0 0 6 * * * Europe/Berlin",
            next_fire_time=now + timedelta(hours=3),
        )
        ScheduledTask.objects.create(
            name=FREQUENT,
            kind="fixed_rate",
            trigger="every 30s",
            next_fire_time=now + timedelta(seconds=25),
        )
        for days in (3, 2):
            self.add_run(DAILY, now - timedelta(days=days), RunStatus.SUCCEEDED)
        self.failed = self.add_run(
            DAILY,
            now - timedelta(days=1),
            RunStatus.FAILED,
            error_type="ValueError",
            error_message=f"No data for {SCRIPT}",
            traceback='Traceback (most recent call last):\n  File "reports.py", line 12\n'
            f"ValueError: No data for {SCRIPT}",
        )
        ScheduledTask.objects.filter(pk=DAILY).update(last_run=self.failed)

    def add_run(self, name, started_at, status, **fields) -> TaskRun:
        fields.setdefault("scheduled_at", started_at)
        fields.setdefault("instance", "web-1:4242")
        return TaskRun.objects.create(
            task_name=name,
            started_at=started_at,
            finished_at=started_at + timedelta(seconds=2),
            duration=timedelta(seconds=2),
            status=status,
            **fields,
        )

    def state_badge(self) -> str:
        return text(self.wait_for(".field-state_badge .ds-badge"))

    def test_overview_shows_overdue_tasks_first(self):
        self.log_in("admin", PASSWORD)
        self.open(TASKS_URL)

        rows = self.wait_for("#result_list").find_elements(By.CSS_SELECTOR, "tbody tr")
        names = [row.find_element(By.CSS_SELECTOR, ".field-name").text for row in rows]
        states = [text(row.find_element(By.CSS_SELECTOR, ".ds-badge")) for row in rows]
        self.assertEqual(names, [OVERDUE, FREQUENT, DAILY])
        self.assertEqual(states, ["overdue", "upcoming", "upcoming"])
        badge = rows[0].find_element(By.CSS_SELECTOR, ".ds-badge--overdue")
        self.assertEqual(badge.value_of_css_property("background-color"), "rgba(185, 28, 28, 1)")
        self.assertEqual(badge.value_of_css_property("font-weight"), "700")
        self.assertIn("1 overdue", text(self.browser.find_element(By.TAG_NAME, "h1")))
        self.assertIn("20 minutes ago", rows[0].text)
        self.screenshot("task-changelist")

        self.open(reverse("admin:app_list", args=["django_scheduling"]))
        self.assertEqual(text(self.wait_for(".ds-summary .ds-overdue-count")), "1 overdue")
        self.screenshot("app-index")

    def test_task_runs_and_a_failed_run(self):
        self.log_in("admin", PASSWORD)
        self.open(TASKS_URL)
        self.click_and_wait(self.wait_for(f'a[href="{task_url(DAILY)}"]'))

        runs = self.wait_for("#ds-recent-runs").find_elements(By.CSS_SELECTOR, "tbody tr")
        self.assertEqual(
            [text(run.find_element(By.CSS_SELECTOR, ".ds-badge")) for run in runs],
            ["failed", "succeeded", "succeeded"],
        )
        self.assertIn(f"ValueError: No data for {SCRIPT}", runs[0].text)
        self.screenshot("task-detail")

        self.click_and_wait(runs[0].find_element(By.TAG_NAME, "a"))

        traceback = self.wait_for("pre.ds-traceback")
        self.assertTrue(traceback.text.endswith(f"ValueError: No data for {SCRIPT}"))
        message = self.browser.find_element(By.CSS_SELECTOR, ".field-error_message .readonly")
        self.assertEqual(message.text, f"No data for {SCRIPT}")
        injected = self.browser.execute_script(
            "return [...document.scripts].some(s => s.text.includes('alert(1)'))"
        )
        self.assertFalse(injected)
        self.screenshot("failed-run")

    def test_pause_and_resume(self):
        self.log_in("admin", PASSWORD)
        self.open(task_url(DAILY))
        self.assertEqual(self.state_badge(), "upcoming")

        self.click_and_wait(self.wait_for("#ds-pause"))

        self.wait_for_text(".messagelist .success", f"Paused {DAILY}")
        self.assertTrue(ScheduledTask.objects.get(pk=DAILY).paused)
        self.assertEqual(self.state_badge(), "paused")

        self.click_and_wait(self.wait_for("#ds-resume"))

        self.wait_for_text(".messagelist .success", f"Resumed {DAILY}")
        self.assertFalse(ScheduledTask.objects.get(pk=DAILY).paused)
        self.assertEqual(self.state_badge(), "upcoming")
        self.wait_for("#ds-pause")

    def test_run_now(self):
        self.log_in("admin", PASSWORD)
        self.open(task_url(FREQUENT))
        self.assertEqual(self.wait_for("#ds-recent-runs").text.count("manual run"), 0)

        self.click_and_wait(self.wait_for("#ds-run"))

        self.wait_for_text(".messagelist .success", f"Requested a run of {FREQUENT} now")
        requested_at = ScheduledTask.objects.get(pk=FREQUENT).run_requested_at
        self.assertIsNotNone(requested_at)

        self.take_run_request(FREQUENT, requested_at)
        self.open(task_url(FREQUENT))

        first_run = self.wait_for("#ds-recent-runs tbody tr")
        self.assertIn("manual run", first_run.text)
        self.assertIn("scheduler-1:77", first_run.text)

    def take_run_request(self, name, requested_at) -> None:
        """Do what a scheduler does with a run request: clear it, run, record the run."""
        taken = ScheduledTask.objects.filter(name=name, run_requested_at=requested_at).update(
            run_requested_at=None
        )
        self.assertEqual(taken, 1)
        run = self.add_run(
            name, timezone.now(), RunStatus.SUCCEEDED, scheduled_at=None, instance="scheduler-1:77"
        )
        ScheduledTask.objects.filter(name=name).update(last_run=run)

    def test_staff_without_permissions_is_refused(self):
        viewer = User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
        viewer.user_permissions.add(Permission.objects.get(codename="view_scheduledtask"))
        self.log_in("viewer", PASSWORD)
        self.open(task_url(DAILY))

        self.wait_for(".field-state_badge")
        self.assertEqual(self.browser.find_elements(By.CSS_SELECTOR, ".ds-tool"), [])

        # Post the pause form anyway, with a valid CSRF token.
        self.browser.execute_script(
            """
            const form = document.createElement("form");
            form.method = "post";
            form.action = arguments[0];
            const token = document.querySelector("[name=csrfmiddlewaretoken]").cloneNode();
            form.appendChild(token);
            document.body.appendChild(form);
            form.submit();
            """,
            reverse("admin:django_scheduling_scheduledtask_pause", args=[quote(DAILY)]),
        )
        self.wait_for_text("h1", "403 Forbidden")
        self.assertFalse(ScheduledTask.objects.get(pk=DAILY).paused)
