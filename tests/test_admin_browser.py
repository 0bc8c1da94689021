"""The admin pages in a real browser: overview, runs, errors, the task controls, and the layout
at a laptop's width and a phone's."""

from datetime import timedelta
from unittest import mock

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from django_scheduling import checks as scheduling_checks
from django_scheduling.models import RunStatus, ScheduledTask, TaskLock, TaskRun
from django_scheduling.tasks.registry import TaskRegistry

from .browser import WINDOW_SIZE, BrowserTestCase

SCRIPT = "<script>alert(1)</script>"
PASSWORD = "correct horse battery staple"
OVERDUE = "billing.send_invoices"
DAILY = "reports.daily_summary"
FREQUENT = "cache.refresh"
TASKS_URL = reverse("admin:django_scheduling_scheduledtask_changelist")
RUNS_URL = reverse("admin:django_scheduling_taskrun_changelist")
LAPTOP = 1280
PHONE = 390
#: A failed run's error as it comes from a real client library: long, and with few spaces.
LONG_ERROR = (
    "HTTPSConnectionPool(host='billing-api.internal.example.com', port=443): Max retries "
    "exceeded with url: /v2/invoices/overdue?since=2026-01-01T00:00:00Z&limit=500&cursor="
    "eyJpZCI6MTIzNDU2Nzg5MCwic29ydCI6ImNyZWF0ZWRfYXQifQ (Caused by NewConnectionError('"
    "<urllib3.connection.HTTPSConnection object at 0x7f3a2c1d5e90>: Failed to establish a new "
    "connection: [Errno 111] Connection refused'))"
)


def text(element: WebElement) -> str:
    """Return the element's text as written, before CSS transforms it (e.g. to upper case)."""
    return element.get_attribute("textContent").strip()


def task_url(name: str) -> str:
    return reverse("admin:django_scheduling_scheduledtask_change", args=[quote(name)])


def run_url(run: TaskRun) -> str:
    return reverse("admin:django_scheduling_taskrun_change", args=[run.pk])


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
        names = [row.find_element(By.CSS_SELECTOR, ".field-task").text for row in rows]
        states = [text(row.find_element(By.CSS_SELECTOR, ".ds-badge")) for row in rows]
        self.assertEqual(names, [OVERDUE, FREQUENT, DAILY])
        self.assertEqual(states, ["overdue", "upcoming", "upcoming"])
        badge = rows[0].find_element(By.CSS_SELECTOR, ".ds-badge--overdue")
        self.assertEqual(badge.value_of_css_property("background-color"), "rgba(185, 28, 28, 1)")
        self.assertEqual(badge.value_of_css_property("font-weight"), "700")
        self.assertIn("1 overdue", text(self.browser.find_element(By.TAG_NAME, "h1")))
        link = self.browser.find_element(By.CSS_SELECTOR, "h1 a.ds-badge--overdue")
        self.assertEqual(link.value_of_css_property("text-decoration-line"), "none")  # a badge
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
        self.assertIn(f"No data for {SCRIPT} (ValueError)", runs[0].text)
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

    def test_configuration_errors_banner(self):
        tasks = TaskRegistry()
        tasks.add(text, cron="0 0 25 * * *", name=f"nightly {SCRIPT}")
        self.log_in("admin", PASSWORD)

        with mock.patch.object(scheduling_checks, "registry", tasks):
            self.open(TASKS_URL)
            banner = self.wait_for("#ds-configuration-errors")
            self.screenshot("configuration-errors")

        self.assertTrue(banner.is_displayed())
        self.assertIn("The scheduler is not running", banner.text)
        self.assertIn(f"nightly {SCRIPT}", banner.text)  # shown as text, not run
        self.assertIn("hour value 25 is out of range 0-23", banner.text)
        self.wait_for("#result_list")  # the list is still there

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


@pytest.mark.browser
class AdminLayoutTests(BrowserTestCase):
    """The task and run lists read well on a laptop (1,280 px) and stay usable on a phone."""

    def setUp(self):
        super().setUp()
        User.objects.create_superuser("admin", "admin@example.com", PASSWORD)
        self.addCleanup(self.browser.set_window_size, *WINDOW_SIZE)
        now = timezone.now()
        # Name, trigger, next fire time in minutes from now.
        tasks = [
            ("billing.tasks.send_overdue_invoice_reminders", "cron 0 */15 * * * * UTC", -20),
            (
                "reports.tasks.build_daily_revenue_summary",
                "cron 0 0 6 * * MON-FRI Europe/Berlin",
                180,
            ),
            ("search.tasks.reindex_changed_products", "every 30s", 1),
            ("maintenance.tasks.purge_expired_sessions", "every 1h (fixed delay)", 45),
        ]
        for name, trigger, minutes in tasks:
            ScheduledTask.objects.create(
                name=name,
                kind="cron" if trigger.startswith("cron") else "fixed_rate",
                trigger=trigger,
                next_fire_time=now + timedelta(minutes=minutes),
                last_fire_time=now - timedelta(minutes=40),
            )
        reports, search = tasks[1][0], tasks[2][0]
        self.failed = self.add_run(reports, now - timedelta(hours=1), RunStatus.FAILED)
        self.succeeded = self.add_run(search, now - timedelta(minutes=2), RunStatus.SUCCEEDED)
        ScheduledTask.objects.filter(pk=reports).update(last_run=self.failed)
        ScheduledTask.objects.filter(pk=search).update(last_run=self.succeeded)
        TaskLock.objects.create(
            name=search,
            locked_by="web-7.eu-central-1.internal:48213",
            locked_at=now,
            lock_until=now + timedelta(minutes=10),
        )

    def add_run(self, name, started_at, status) -> TaskRun:
        failed = status == RunStatus.FAILED
        return TaskRun.objects.create(
            task_name=name,
            scheduled_at=started_at,
            started_at=started_at,
            finished_at=started_at + timedelta(seconds=31),
            duration=timedelta(seconds=31.2),
            status=status,
            instance="web-7.eu-central-1.internal:48213",
            error_type="requests.exceptions.ConnectionError" if failed else "",
            error_message=LONG_ERROR if failed else "",
            traceback=f"Traceback (most recent call last):\n  ...\n{LONG_ERROR}" if failed else "",
        )

    def at_width(self, width: int, path: str) -> None:
        self.browser.set_window_size(width, 900)
        self.open(path)
        self.wait_for("#result_list")
        self.assertEqual(self.browser.execute_script("return window.innerWidth"), width)

    def assert_no_horizontal_scrolling(self) -> None:
        """Neither the page nor the list scrolls sideways: no column hides to the right."""
        self.assert_page_fits()
        table, results = self.browser.execute_script(
            """
            const results = document.querySelector("#changelist .results");
            return [results.scrollWidth, results.clientWidth];
            """
        )
        self.assertLessEqual(table, results, "the list scrolls sideways")

    def assert_page_fits(self) -> None:
        """The page does not scroll sideways (clientWidth: the window less its scroll bar)."""
        page, window = self.browser.execute_script(
            "const root = document.documentElement; return [root.scrollWidth, root.clientWidth];"
        )
        self.assertLessEqual(page, window, "the page scrolls sideways")

    def assert_on_screen(self, element: WebElement) -> None:
        """Assert that *element* shows from its left edge to its right edge, without scrolling
        sideways: within the window, and not cut off by a list that scrolls."""
        shown = self.browser.execute_script(
            """
            const element = arguments[0];
            const top = element.getBoundingClientRect().top;
            window.scrollBy(0, top - window.innerHeight / 2);  // vertically only
            const box = element.getBoundingClientRect();
            const y = box.top + Math.min(box.height / 2, 8);
            const shows = x => element.contains(document.elementFromPoint(x, y));
            return box.left >= 0 && box.right <= document.documentElement.clientWidth
                && shows(box.left + 1) && shows(box.right - 1);
            """,
            element,
        )
        self.assertTrue(shown, f"not fully on screen: {element.text!r}")

    def row_of(self, run: TaskRun) -> WebElement:
        link = self.wait_for(f'#result_list a[href="{run_url(run)}"]')
        return link.find_element(By.XPATH, "./ancestor::tr")

    def test_run_list_at_laptop_width(self):
        self.log_in("admin", PASSWORD)
        self.at_width(LAPTOP, RUNS_URL)
        self.screenshot(f"task-runs-{LAPTOP}")

        self.assert_no_horizontal_scrolling()
        failed, succeeded = self.row_of(self.failed), self.row_of(self.succeeded)
        # The error takes one line: a failed run is no taller than a run without an error.
        self.assertLessEqual(failed.rect["height"], succeeded.rect["height"])
        self.assertLess(failed.rect["height"], 60)
        error = failed.find_element(By.CSS_SELECTOR, ".ds-error")
        self.assertGreater(error.rect["width"], 200)  # readable, not one character per line
        self.assertEqual(error.get_attribute("title"), f"{self.failed.error_type}: {LONG_ERROR}")
        self.assert_on_screen(error)

    def test_a_late_beginning_shows_under_the_duration_at_laptop_width(self):
        self.log_in("admin", PASSWORD)
        started = timezone.now() - timedelta(minutes=1)
        waited = TaskRun.objects.create(
            task_name="search.tasks.reindex_changed_products",
            scheduled_at=started,
            started_at=started,
            finished_at=started + timedelta(seconds=14.5),  # began 12.5 s late, ran 2 s
            duration=timedelta(seconds=2),
            status=RunStatus.SUCCEEDED,
            instance="web-7.eu-central-1.internal:48213",
        )
        self.at_width(LAPTOP, RUNS_URL)

        self.assert_no_horizontal_scrolling()
        delay = self.row_of(waited).find_element(
            By.CSS_SELECTOR, ".field-duration_text .ds-relative"
        )
        self.assertEqual(text(delay), "began 12.50s after its start")
        self.assert_on_screen(delay)
        self.assertFalse(
            self.row_of(self.succeeded).find_elements(By.CSS_SELECTOR, ".field-duration_text span")
        )

    def test_task_list_at_laptop_width(self):
        self.log_in("admin", PASSWORD)
        self.at_width(LAPTOP, TASKS_URL)
        self.screenshot(f"task-changelist-{LAPTOP}")

        self.assert_no_horizontal_scrolling()
        header = self.browser.find_element(By.CSS_SELECTOR, "#result_list th.column-lock")
        self.assertEqual(text(header).lower(), "lock held by")
        self.assert_on_screen(header)
        self.assert_on_screen(self.wait_for(".field-lock"))
        for row in self.browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"):
            self.assertLess(row.rect["height"], 70, row.text)  # three lines at most

    def test_task_page_at_laptop_width(self):
        self.log_in("admin", PASSWORD)
        self.browser.set_window_size(LAPTOP, 900)
        self.open(task_url(self.failed.task_name))
        row = self.wait_for("#ds-recent-runs tbody tr")
        self.browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", row)
        self.screenshot(f"task-detail-{LAPTOP}")

        self.assert_page_fits()
        self.assertLess(row.rect["height"], 60)
        error = row.find_element(By.CSS_SELECTOR, ".ds-error")
        self.assertEqual(error.get_attribute("title"), f"{self.failed.error_type}: {LONG_ERROR}")

    def test_lists_at_phone_width(self):
        self.log_in("admin", PASSWORD)
        for path, key_columns in [
            (TASKS_URL, [".field-task", ".field-state_badge"]),
            (RUNS_URL, [".field-id", ".field-status_badge", ".field-task"]),
        ]:
            with self.subTest(path):
                self.at_width(PHONE, path)
                name = "task-changelist" if path == TASKS_URL else "task-runs"
                self.screenshot(f"{name}-{PHONE}")

                self.assert_page_fits()
                # What a row is about fits on the screen without scrolling the list; the list
                # scrolls to show the rest.
                for css in key_columns:
                    for cell in self.browser.find_elements(By.CSS_SELECTOR, f"#result_list {css}"):
                        self.assert_on_screen(cell)


#: A scheduler's default instance name, as on a cloud host: long, with its pid namespace.
INSTANCE = "ip-10-0-12-34.eu-central-1.compute.internal@4026531836:48213:1795000000"
FAILING = "billing.tasks.charge_customer_subscriptions"
HUNG = "imports.tasks.synchronise_product_catalogue"
NIGHTLY = "reports.tasks.build_nightly_revenue_summary"


@pytest.mark.browser
class AttentionBrowserTests(BrowserTestCase):
    """What needs someone's attention shows at a laptop's width (1,280 px): a hung run, a task
    that keeps failing, a run past its timeout, lost runs; and the pid of an instance."""

    def setUp(self):
        super().setUp()
        User.objects.create_superuser("admin", "admin@example.com", PASSWORD)
        self.browser.set_window_size(LAPTOP, 900)
        self.addCleanup(self.browser.set_window_size, *WINDOW_SIZE)
        now = self.now = timezone.now()
        for name, trigger, minutes in (
            (FAILING, "cron 0 */10 * * * * UTC", 5),
            (HUNG, "every 5m", -10),
            (NIGHTLY, "cron 0 0 2 * * * Europe/Berlin", 300),
        ):
            ScheduledTask.objects.create(
                name=name,
                kind="cron" if trigger.startswith("cron") else "fixed_rate",
                trigger=trigger,
                next_fire_time=now + timedelta(minutes=minutes),
                last_fire_time=now - timedelta(minutes=20),
            )
        for minutes, status in (
            (90, RunStatus.SUCCEEDED),
            (80, RunStatus.LOST),
            (70, RunStatus.FAILED),
            (60, RunStatus.TIMED_OUT),
        ):
            self.failing_run = self.add_run(FAILING, now - timedelta(minutes=minutes), status)
        ScheduledTask.objects.filter(pk=FAILING).update(last_run=self.failing_run)
        self.hung_run = self.add_run(HUNG, now - timedelta(minutes=20), RunStatus.RUNNING)
        ScheduledTask.objects.filter(pk=HUNG).update(last_run=self.hung_run)
        TaskLock.objects.create(
            name=HUNG, locked_by=INSTANCE, locked_at=now, lock_until=now + timedelta(minutes=5)
        )
        ok = self.add_run(NIGHTLY, now - timedelta(seconds=12), RunStatus.SUCCEEDED)
        ScheduledTask.objects.filter(pk=NIGHTLY).update(last_run=ok)
        self.log_in("admin", PASSWORD)

    def add_run(self, name, started_at, status) -> TaskRun:
        ended = status not in (RunStatus.RUNNING, RunStatus.LOST)
        failed = status in (RunStatus.FAILED, RunStatus.TIMED_OUT)
        return TaskRun.objects.create(
            task_name=name,
            scheduled_at=started_at,
            started_at=started_at,
            finished_at=started_at + timedelta(seconds=40) if ended else None,
            duration=timedelta(seconds=40) if ended else None,
            status=status,
            instance=INSTANCE,
            timeout_at=started_at + timedelta(seconds=30) if status != RunStatus.RUNNING else None,
            missed_count=2 if status == RunStatus.SUCCEEDED else 0,
            error_type="stripe.error.APIConnectionError" if failed else "",
            error_message="Stripe answered 503 Service Unavailable after 3 attempts"
            if failed
            else "",
        )

    def row(self, name: str) -> WebElement:
        link = self.wait_for(f'#result_list a[href="{task_url(name)}"]')
        return link.find_element(By.XPATH, "./ancestor::tr")

    def assert_no_sideways_scroll(self) -> None:
        page, window, table, results = self.browser.execute_script(
            """
            const root = document.documentElement;
            const results = document.querySelector("#changelist .results");
            return [root.scrollWidth, root.clientWidth, results.scrollWidth, results.clientWidth];
            """
        )
        self.assertLessEqual(page, window, "the page scrolls sideways")
        self.assertLessEqual(table, results, "the list scrolls sideways")

    def assert_fully_shown(self, element: WebElement) -> None:
        """*element* shows whole: not cut by its column, and within the window."""
        shown, clipped = self.browser.execute_script(
            """
            const element = arguments[0];
            element.scrollIntoView({block: "center"});
            const box = element.getBoundingClientRect();
            let clipped = false;
            for (let parent = element.parentElement; parent; parent = parent.parentElement) {
                const frame = parent.getBoundingClientRect();
                const style = getComputedStyle(parent);
                if (style.overflowX !== "visible"
                    && (box.left < frame.left - 0.5 || box.right > frame.right + 0.5)) {
                    clipped = true;
                }
            }
            const inside = box.left >= 0 && box.right <= document.documentElement.clientWidth;
            return [inside && box.width > 0, clipped];
            """,
            element,
        )
        self.assertTrue(shown, f"off screen: {text(element)!r}")
        self.assertFalse(clipped, f"cut off: {text(element)!r}")

    def test_the_task_list_says_what_needs_attention(self):
        self.open(TASKS_URL)
        self.wait_for("#result_list")
        self.screenshot(f"attention-task-list-{LAPTOP}")
        self.assert_no_sideways_scroll()
        hung = self.row(HUNG)
        self.assertEqual(text(hung.find_element(By.CSS_SELECTOR, ".ds-badge")), "overdue")
        self.assertIn("a run hangs", hung.text)
        failing = self.row(FAILING)
        self.assertEqual(text(failing.find_element(By.CSS_SELECTOR, ".ds-badge")), "failing")
        nightly = self.row(NIGHTLY)
        self.assertEqual(
            text(nightly.find_element(By.CSS_SELECTOR, ".ds-last-success")), "✓ just now"
        )
        # The lock holder's pid shows whole, whatever the length of its host name.
        pid = hung.find_element(By.CSS_SELECTOR, ".field-lock .ds-pid")
        self.assertEqual(text(pid), ":48213")
        self.assert_fully_shown(pid)
        instance = hung.find_element(By.CSS_SELECTOR, ".field-lock .ds-instance")
        self.assertEqual(instance.get_attribute("title"), INSTANCE)

    def test_the_run_list_shows_the_pid_and_the_error_message(self):
        self.open(RUNS_URL)
        self.wait_for("#result_list")
        self.screenshot(f"attention-run-list-{LAPTOP}")
        self.assert_no_sideways_scroll()
        rows = self.browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
        for row in rows:
            pid = row.find_element(By.CSS_SELECTOR, ".field-started_on .ds-pid")
            self.assertEqual(text(pid), ":48213")
            self.assert_fully_shown(pid)
        [failed] = [row for row in rows if row.find_elements(By.CSS_SELECTOR, ".ds-badge--failed")]
        message = failed.find_element(By.CSS_SELECTOR, ".ds-error-message")
        self.assertEqual(text(message), "Stripe answered 503 Service Unavailable after 3 attempts")
        visible = self.browser.execute_script(
            "const m = arguments[0]; const cell = m.closest('td').getBoundingClientRect();"
            "return Math.min(m.getBoundingClientRect().right, cell.right)"
            " - m.getBoundingClientRect().left;",
            message,
        )
        self.assertGreater(visible, 150, "the message is cut to nothing")
        hung = self.browser.find_element(
            By.XPATH, f'//*[@id="result_list"]//a[@href="{run_url(self.hung_run)}"]/ancestor::tr'
        )
        self.assertEqual(hung.find_element(By.CSS_SELECTOR, ".field-status_badge").text, "running")
        TaskRun.objects.filter(pk=self.hung_run.pk).update(timeout_at=self.now)
        self.open(RUNS_URL)
        hung = self.browser.find_element(
            By.XPATH, f'//*[@id="result_list"]//a[@href="{run_url(self.hung_run)}"]/ancestor::tr'
        )
        self.assertEqual(
            hung.find_element(By.CSS_SELECTOR, ".field-status_badge").text, "running timed out"
        )

    def test_yes_and_no_read_as_words_and_lost_runs_show_in_the_chart(self):
        self.open(task_url(FAILING))
        chart = self.wait_for("#ds-run-chart")
        self.screenshot(f"attention-task-page-{LAPTOP}")
        paused = self.browser.find_element(By.CSS_SELECTOR, ".field-paused_text .readonly")
        self.assertEqual(paused.text, "No")
        self.assertEqual(self.browser.find_elements(By.CSS_SELECTOR, "img[src$='icon-no.svg']"), [])
        heights = {
            bar.get_attribute("data-status"): float(bar.get_attribute("height"))
            for bar in chart.find_elements(By.CSS_SELECTOR, ".ds-bar")
        }
        self.assertEqual(set(heights), {"succeeded", "lost", "failed", "timed_out"})
        # A lost run has no duration; its bar reaches the top, as the longest run's does.
        self.assertEqual(heights["lost"], max(heights.values()))
        self.assertGreater(heights["timed_out"], 2)

        self.open(run_url(self.failing_run))
        lock_lost = self.wait_for(".field-lock_lost_text .readonly")
        self.assertEqual(lock_lost.text, "No")
        self.assertEqual(self.browser.find_elements(By.CSS_SELECTOR, "img[src$='icon-no.svg']"), [])
        self.assertEqual(text(self.wait_for(".field-status_badge .ds-badge")), "timed out")

    def test_the_timeline_title_says_the_span_it_shows(self):
        # A task every 10 s: its 1,440 firings shown end the timeline after 4 hours.
        ScheduledTask.objects.create(
            name="poll.tasks.feed", kind="fixed_rate", trigger="every 10s", anchor=self.now
        )
        registry = TaskRegistry()
        registry.add(lambda: None, fixed_rate="10s", name="poll.tasks.feed")
        with mock.patch("django_scheduling.tasks.registry.registry", registry):
            self.open(reverse("admin:django_scheduling_scheduledtask_timeline"))
            strip = self.wait_for("#ds-timeline-strip")
        self.screenshot(f"attention-timeline-{LAPTOP}")
        title = text(self.browser.find_element(By.TAG_NAME, "h1"))
        self.assertRegex(title, r"^Timeline of the next (3 hours 59 minutes|4 hours)$")
        # The bars fill the strip: no empty stretch after the span the title names.
        right = max(
            float(bar.get_attribute("x")) + float(bar.get_attribute("width"))
            for bar in strip.find_elements(By.CSS_SELECTOR, ".ds-slot")
        )
        self.assertGreater(right, 1000 - 1000 / 20)
