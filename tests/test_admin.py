"""The admin pages: task overview, run history, locks, and the pause / resume / run-now controls."""

import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from unittest import mock

from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, TestCase, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from django_scheduling import checks as scheduling_checks
from django_scheduling.admin.views import breakable
from django_scheduling.models import RunStatus, ScheduledTask, TaskLock, TaskRun
from django_scheduling.tasks.registry import TaskRegistry

SCRIPT = "<script>alert(1)</script>"
ESCAPED_SCRIPT = "&lt;script&gt;alert(1)&lt;/script&gt;"
VIEW_ALL = ["view_scheduledtask", "view_taskrun", "view_tasklock"]


def make_task(name: str, next_fire_time: datetime | None, **fields) -> ScheduledTask:
    fields.setdefault("trigger", "every 30s")
    fields.setdefault("kind", "fixed_rate")
    return ScheduledTask.objects.create(name=name, next_fire_time=next_fire_time, **fields)


def make_run(task_name: str, started_at: datetime, **fields) -> TaskRun:
    fields.setdefault("status", RunStatus.SUCCEEDED)
    fields.setdefault("instance", "web-1:100")
    return TaskRun.objects.create(task_name=task_name, started_at=started_at, **fields)


def staff_user(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_scheduling", codename__in=codenames
        )
    )
    return user


def task_url(name: str, view: str = "change") -> str:
    return reverse(f"admin:django_scheduling_scheduledtask_{view}", args=[quote(name)])


TASKS_URL = reverse("admin:django_scheduling_scheduledtask_changelist")
RUNS_URL = reverse("admin:django_scheduling_taskrun_changelist")
LOCKS_URL = reverse("admin:django_scheduling_tasklock_changelist")


#: What separates the items of the breadcrumbs: ``&rsaquo;``.
SEPARATOR = "\u203a"
#: The elements without an end tag that may appear in the breadcrumbs.
VOID_ELEMENTS = {"br", "img", "wbr"}


class BreadcrumbsParser(HTMLParser):
    """Collect the text of the page's breadcrumbs element, with a separator (U+203A, as
    ``&rsaquo;``) before each list item.

    Django 5.2 writes the breadcrumbs as ``<div class="breadcrumbs">`` with ``&rsaquo;``
    between the items; Django 6 as ``<ol class="breadcrumbs">`` with one ``<li>`` an item.
    """

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0  # Of the open elements inside the breadcrumbs element, itself included.
        self.found = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.depth:
            self.depth += tag not in VOID_ELEMENTS
            if tag == "li":
                self.text.append(SEPARATOR)
        elif "breadcrumbs" in (dict(attrs).get("class") or "").split():
            self.depth = 1
            self.found += 1

    def handle_endtag(self, tag: str) -> None:
        if self.depth:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.text.append(data)


def breadcrumbs(page: str) -> list[str]:
    """Return the items of the breadcrumbs on *page*, first to last."""
    parser = BreadcrumbsParser()
    parser.feed(page)
    parser.close()
    assert parser.found == 1, f"{parser.found} breadcrumbs elements on the page"
    items = (" ".join(item.split()) for item in "".join(parser.text).split(SEPARATOR))
    return [item for item in items if item]


class AdminTestCase(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.superuser = User.objects.create_superuser("root", "root@example.com", "pw")
        cls.viewer = staff_user("viewer", *VIEW_ALL)

    def setUp(self):
        self.now = timezone.now()
        self.client.force_login(self.superuser)

    def rows(self, response) -> dict[str, str]:
        """Return the change list's tasks in page order, each with its state."""
        return {task.name: task.state for task in response.context["cl"].result_list}


class TaskChangeListTests(AdminTestCase):
    def test_overdue_first_then_by_next_fire_time(self):
        hour = timedelta(hours=1)
        make_task("b.later", self.now + 2 * hour)
        make_task("a.sooner", self.now + hour)
        make_task("z.overdue", self.now - hour)
        make_task("y.overdue.earlier", self.now - 2 * hour)
        make_task("paused", self.now - hour, paused=True)
        make_task("done", None)
        make_task("removed", self.now - hour, removed_at=self.now)
        run = make_run("running", self.now - hour, status=RunStatus.RUNNING)
        make_task("running", self.now - hour, last_fire_time=self.now - hour, last_run=run)

        response = self.client.get(TASKS_URL)

        self.assertEqual(
            list(self.rows(response).items()),
            [
                ("y.overdue.earlier", "overdue"),
                ("z.overdue", "overdue"),
                ("running", "running"),
                ("a.sooner", "upcoming"),
                ("b.later", "upcoming"),
                ("paused", "paused"),
                ("done", "done"),
                ("removed", "removed"),
            ],
        )
        self.assertContains(
            response, '<span class="ds-badge ds-badge--overdue">overdue</span>', count=2, html=True
        )

    def test_filter_by_state_and_search_by_name(self):
        make_task("billing.invoices", self.now - timedelta(hours=1))
        make_task("billing.reminders", self.now + timedelta(hours=1))
        make_task("reports.daily", self.now + timedelta(hours=1))

        overdue = self.client.get(TASKS_URL, {"state": "overdue"})
        upcoming_billing = self.client.get(TASKS_URL, {"state": "upcoming", "q": "billing"})

        self.assertEqual(list(self.rows(overdue)), ["billing.invoices"])
        self.assertEqual(list(self.rows(upcoming_billing)), ["billing.reminders"])

    @override_settings(TIME_ZONE="America/New_York")
    def test_next_fire_time_in_the_project_time_zone(self):
        make_task("yearly", datetime(2031, 1, 15, 17, 0, tzinfo=UTC))

        response = self.client.get(TASKS_URL)

        self.assertContains(response, "2031-01-15 12:00:00 EST")

    def test_relative_times_as_django_humanize_writes_them(self):
        make_task("soon", self.now + timedelta(minutes=3, seconds=30))
        make_task("late", self.now - timedelta(minutes=5, seconds=30))
        make_task("in.seconds", self.now + timedelta(seconds=40))
        make_task("in.hours", self.now + timedelta(hours=2, minutes=59, seconds=30))

        response = self.client.get(TASKS_URL)

        self.assertContains(response, "3\xa0minutes from now")
        self.assertContains(response, "5\xa0minutes ago")
        self.assertRegex(response.content.decode(), "[34][0-9]\xa0seconds from now")
        self.assertContains(response, "2\xa0hours from now")

    def test_last_run_and_lock_holder(self):
        run = make_run("cleanup", self.now - timedelta(minutes=1), duration=timedelta(seconds=1.5))
        make_task("cleanup", self.now + timedelta(hours=1), last_run=run)
        make_task("other", self.now + timedelta(hours=1))
        TaskLock.objects.create(
            name="cleanup",
            locked_by="worker-a:123",
            locked_at=self.now,
            lock_until=self.now + timedelta(minutes=10),
        )
        TaskLock.objects.create(
            name="other",
            locked_by="worker-b:456",
            locked_at=self.now - timedelta(hours=1),
            lock_until=self.now - timedelta(minutes=50),
        )

        response = self.client.get(TASKS_URL)

        run_url = reverse("admin:django_scheduling_taskrun_change", args=[run.pk])
        self.assertContains(response, f'<a href="{run_url}">')
        self.assertContains(response, "1.50s")
        self.assertContains(response, "worker-a:123")
        self.assertNotContains(response, "worker-b:456")  # expired: nobody holds it

    def test_no_query_per_task(self):
        def add_task(index: int) -> None:
            name = f"task.{index:02}"
            run = make_run(name, self.now - timedelta(minutes=1))
            make_task(name, self.now + timedelta(minutes=index), last_run=run)
            TaskLock.objects.create(
                name=name, locked_by="w", locked_at=self.now, lock_until=self.now + timedelta(1)
            )

        add_task(0)
        with CaptureQueriesContext(connection) as one_task:
            self.client.get(TASKS_URL)
        for index in range(1, 20):
            add_task(index)

        with self.assertNumQueries(len(one_task)):
            response = self.client.get(TASKS_URL)
        self.assertEqual(len(response.context["cl"].result_list), 20)

    def test_header_and_app_index_count_the_overdue_tasks(self):
        make_task("late.one", self.now - timedelta(hours=1))
        make_task("late.two", self.now - timedelta(hours=2))
        make_task("fine", self.now + timedelta(hours=1))

        changelist = self.client.get(TASKS_URL)
        app_index = self.client.get(reverse("admin:app_list", args=["django_scheduling"]))

        overdue_link = f'href="{TASKS_URL}?state=overdue"'
        for response in (changelist, app_index):
            with self.subTest(response.request["PATH_INFO"]):
                self.assertContains(response, "2 overdue")
                self.assertContains(response, overdue_link)
                self.assertContains(response, "django_scheduling/admin.css")

    def test_nothing_overdue(self):
        make_task("fine", self.now + timedelta(hours=1))

        response = self.client.get(TASKS_URL)

        self.assertContains(response, "0 overdue")
        self.assertNotContains(response, "ds-badge--overdue")

    def test_app_index_count_needs_the_view_permission_on_tasks(self):
        make_task("late", self.now - timedelta(hours=1))
        self.client.force_login(staff_user("runs-only", "view_taskrun"))

        response = self.client.get(reverse("admin:app_list", args=["django_scheduling"]))

        self.assertEqual(response.status_code, 200)
        self.assertNotContains(response, "overdue")

    def test_main_index_shows_the_count_whatever_the_order_of_installed_apps(self):
        make_task("late", self.now - timedelta(hours=1))
        others = [app for app in settings.INSTALLED_APPS if app != "django_scheduling"]
        admin_position = others.index("django.contrib.admin")
        orders = {
            "django_scheduling last": [*others, "django_scheduling"],
            "django_scheduling above django.contrib.admin": [
                *others[:admin_position],
                "django_scheduling",
                *others[admin_position:],
            ],
        }
        for label, installed_apps in orders.items():
            with self.subTest(label), override_settings(INSTALLED_APPS=installed_apps):
                index = self.client.get(reverse("admin:index"))
                app_index = self.client.get(reverse("admin:app_list", args=["django_scheduling"]))

                self.assertContains(index, "1 overdue", count=1)
                self.assertContains(index, "Recent actions")  # the rest of the page is there
                self.assertContains(index, "django_scheduling/admin.css", count=1)
                self.assertContains(app_index, "1 overdue", count=1)

    def test_main_index_count_needs_the_view_permission_on_tasks(self):
        make_task("late", self.now - timedelta(hours=1))
        self.client.force_login(staff_user("runs-only", "view_taskrun"))

        response = self.client.get(reverse("admin:index"))

        self.assertContains(response, "Task runs")
        self.assertNotContains(response, "overdue")

    def test_view_permission_is_required(self):
        self.client.force_login(staff_user("nobody"))

        self.assertEqual(self.client.get(TASKS_URL).status_code, 403)
        self.assertEqual(self.client.get(RUNS_URL).status_code, 403)
        self.assertEqual(self.client.get(LOCKS_URL).status_code, 403)

    def test_no_add_or_delete(self):
        make_task("cleanup", self.now)

        add_url = reverse("admin:django_scheduling_scheduledtask_add")

        self.assertEqual(self.client.get(task_url("cleanup", "delete")).status_code, 403)
        self.assertEqual(self.client.get(add_url).status_code, 403)
        response = self.client.get(TASKS_URL)
        self.assertNotContains(response, "delete_selected")
        self.assertNotContains(response, add_url)


class FailingStateTests(AdminTestCase):
    """A task whose last runs failed shows "failing", in the list and on its page, read from the
    runs the list reads for its sparkline (no query of its own in the list)."""

    def shown(self, response) -> dict[str, str]:
        """Return each task of the change list with the state its badge shows."""
        cl = response.context["cl"]
        return {
            task.name: re.search(r"ds-badge--(\w+)", cl.model_admin.state_badge(task))[1]
            for task in cl.result_list
        }

    def runs(self, name, *statuses):
        last = None
        for minutes, status in enumerate(statuses):
            last = TaskRun.objects.create(
                task_name=name,
                started_at=self.now - timedelta(hours=1) + timedelta(minutes=minutes),
                status=status,
                instance="web-1:1:1",
            )
        ScheduledTask.objects.filter(name=name).update(last_run=last)

    def test_the_last_three_runs_failed(self):
        make_task("failing", self.now + timedelta(minutes=5))
        make_task("recovered", self.now + timedelta(minutes=5))
        make_task("two", self.now + timedelta(minutes=5))
        self.runs("failing", "succeeded", "failed", "interrupted", "timed_out", "lost")
        self.runs("recovered", "failed", "failed", "failed", "succeeded")
        self.runs("two", "succeeded", "failed", "failed")

        response = self.client.get(TASKS_URL)

        self.assertEqual(
            self.shown(response),
            {"failing": "failing", "recovered": "upcoming", "two": "upcoming"},
        )
        page = self.client.get(task_url("failing"))
        self.assertContains(page, '<span class="ds-badge ds-badge--failing">failing</span>')

    @override_settings(SCHEDULING={"ALERT_AFTER_FAILURES": 2})
    def test_the_number_follows_alert_after_failures(self):
        make_task("two", self.now + timedelta(minutes=5))
        self.runs("two", "succeeded", "failed", "failed")
        self.assertEqual(self.shown(self.client.get(TASKS_URL)), {"two": "failing"})


@override_settings(
    TIME_ZONE="America/New_York", SCHEDULING={"OVERDUE_AFTER": "5m", "AUTOSTART": False}
)
class OverdueRuleTests(AdminTestCase):
    def test_overdue_rule(self):
        six_late = self.now - timedelta(minutes=6)
        make_task("four.minutes.late", self.now - timedelta(minutes=4))
        make_task("six.minutes.late", six_late)
        make_task("six.minutes.late.paused", six_late, paused=True)
        make_task("six.minutes.late.started", six_late, last_fire_time=six_late)
        make_task("six.minutes.late.removed", six_late, removed_at=self.now)
        make_task("fired.before", six_late, last_fire_time=six_late - timedelta(minutes=1))

        response = self.client.get(TASKS_URL)
        overdue = self.client.get(TASKS_URL, {"state": "overdue"})

        self.assertEqual(
            self.rows(response),
            {
                "six.minutes.late": "overdue",
                "fired.before": "overdue",
                "four.minutes.late": "upcoming",
                "six.minutes.late.started": "upcoming",
                "six.minutes.late.paused": "paused",
                "six.minutes.late.removed": "removed",
            },
        )
        self.assertEqual(set(self.rows(overdue)), {"six.minutes.late", "fired.before"})
        self.assertContains(response, "2 overdue")


@override_settings(TIME_ZONE="Europe/Berlin")
class TimeFormatTests(AdminTestCase):
    """Every time in the admin reads the same: project zone, seconds, zone abbreviation."""

    WINTER = datetime(2026, 1, 15, 12, 0, 5, tzinfo=UTC)
    SUMMER = datetime(2026, 7, 15, 12, 0, 5, tzinfo=UTC)
    FUTURE = datetime(2031, 1, 15, 17, 30, 0, tzinfo=UTC)
    WINTER_TEXT = "2026-01-15 13:00:05 CET"
    SUMMER_TEXT = "2026-07-15 14:00:05 CEST"
    FUTURE_TEXT = "2031-01-15 18:30:00 CET"

    def setUp(self):
        super().setUp()
        self.run = make_run(
            "once",
            self.WINTER,
            scheduled_at=self.WINTER,
            finished_at=self.SUMMER,
            duration=self.SUMMER - self.WINTER,
        )
        make_task(
            "once",
            None,
            kind="one_shot",
            trigger=f"once at {self.SUMMER.isoformat()}",
            anchor=self.SUMMER,
            last_fire_time=self.WINTER,
            last_finished_at=self.SUMMER,
            last_run=self.run,
        )
        make_task("every.minute", self.FUTURE, run_requested_at=self.SUMMER)
        TaskLock.objects.create(
            name="every.minute", locked_by="w:1", locked_at=self.SUMMER, lock_until=self.FUTURE
        )

    def test_the_task_list(self):
        text = strip_tags(self.client.get(TASKS_URL).content.decode())

        self.assertIn(f"once at {self.SUMMER_TEXT}", text)  # not raw ISO
        self.assertEqual(text.count(self.FUTURE_TEXT), 2)  # next fire time, lock
        self.assertIn(f"until {self.FUTURE_TEXT}", text)

    def test_a_task_page(self):
        response = self.client.get(task_url("once"))

        self.assertContains(response, f"once at {self.SUMMER_TEXT}")
        for label, text in [
            ("Last fire time claimed", self.WINTER_TEXT),
            ("Last finished at", self.SUMMER_TEXT),
            ("Fixed-rate anchor", self.SUMMER_TEXT),
        ]:
            with self.subTest(label):
                self.assertRegex(
                    response.content.decode(), rf"{label}:</label>\s*<div[^>]*>{text}</div>"
                )
        recent = response.content.decode().split('id="ds-recent-runs"')[1]
        self.assertIn(f"<td>{self.WINTER_TEXT}</td>", recent)  # scheduled for
        self.assertIn(f"<td>{self.WINTER_TEXT}<span", recent)  # started at, then the instance

        response = self.client.get(task_url("every.minute"))
        self.assertRegex(
            response.content.decode(),
            rf"Run requested at:</label>\s*<div[^>]*>{self.SUMMER_TEXT}</div>",
        )

    def test_a_run_page_title_and_breadcrumb(self):
        response = self.client.get(
            reverse("admin:django_scheduling_taskrun_change", args=[self.run.pk])
        )

        name = f"once at {self.WINTER_TEXT}"
        self.assertEqual(str(self.run), name)
        self.assertContains(response, f"<title>{name} | View task run")
        self.assertEqual(
            breadcrumbs(response.content.decode()), ["Home", "Scheduling", "Task runs", name]
        )
        self.assertContains(response, f"<h2>{name}</h2>")
        for text in (self.WINTER_TEXT, self.SUMMER_TEXT):  # scheduled, started, finished
            self.assertContains(response, f'<div class="readonly">{text}</div>', html=True)

    def test_the_run_and_lock_lists(self):
        self.assertContains(self.client.get(RUNS_URL), self.WINTER_TEXT)
        locks = self.client.get(LOCKS_URL)
        self.assertContains(locks, self.SUMMER_TEXT)
        self.assertContains(locks, self.FUTURE_TEXT)


def job():
    pass


class LockLostAndRecoveryTests(AdminTestCase):
    def test_a_run_that_lost_its_lock_says_so_in_the_list_and_on_its_page(self):
        stale = make_run("job", self.now, lock_lost=True)
        make_run("job", self.now - timedelta(minutes=1))
        response = self.client.get(RUNS_URL)
        self.assertContains(response, 'ds-badge--failed">lock lost</span>', count=1)
        response = self.client.get(RUNS_URL + "?lock_lost__exact=1")
        self.assertEqual([run.pk for run in response.context["cl"].result_list], [stale.pk])
        page = self.client.get(reverse("admin:django_scheduling_taskrun_change", args=[stale.pk]))
        self.assertContains(page, "lock lost")

    def test_a_run_that_began_after_its_start_says_how_long_beside_its_duration(self):
        # Its start was recorded at the claim; the task began 3 s later, and ran 1.5 s.
        late = make_run(
            "job",
            self.now,
            duration=timedelta(seconds=1.5),
            finished_at=self.now + timedelta(seconds=4.5),
        )
        prompt = make_run(
            "job",
            self.now - timedelta(minutes=1),
            duration=timedelta(seconds=2),
            finished_at=self.now - timedelta(minutes=1) + timedelta(seconds=2.004),
        )
        # Turned away by the pool 3 s after its start: its task never began.
        rejected = make_run(
            "job",
            self.now - timedelta(minutes=2),
            status=RunStatus.REJECTED,
            duration=timedelta(0),
            finished_at=self.now - timedelta(minutes=2) + timedelta(seconds=3),
        )
        response = self.client.get(RUNS_URL)
        self.assertContains(response, "began 3.00s after its start", count=1)
        for run, shown in ((late, True), (prompt, False), (rejected, False)):
            page = self.client.get(reverse("admin:django_scheduling_taskrun_change", args=[run.pk]))
            self.assertEqual("after its start" in page.content.decode(), shown)

    def test_a_commands_output_is_shown_escaped_on_its_runs_page(self):
        run = make_run("sessions.clear", self.now, output="<b>42 sessions</b> removed\n")
        quiet = make_run("job", self.now - timedelta(minutes=1))
        page = self.client.get(reverse("admin:django_scheduling_taskrun_change", args=[run.pk]))
        self.assertContains(
            page, '<pre class="ds-output">&lt;b&gt;42 sessions&lt;/b&gt; removed\n</pre>'
        )
        page = self.client.get(reverse("admin:django_scheduling_taskrun_change", args=[quiet.pk]))
        self.assertNotContains(page, "ds-output")

    def test_a_recovery_links_the_lost_run(self):
        lost = make_run("job", self.now - timedelta(minutes=1), status=RunStatus.LOST)
        recovery = make_run("job", self.now, recovery_of=lost)
        page = self.client.get(
            reverse("admin:django_scheduling_taskrun_change", args=[recovery.pk])
        )
        lost_url = reverse("admin:django_scheduling_taskrun_change", args=[lost.pk])
        self.assertContains(page, f'href="{lost_url}"')


class ConfigurationErrorBannerTests(AdminTestCase):
    """A banner says the scheduler is not running, and why, when the app's checks fail."""

    pages = {
        "home": reverse("admin:index"),
        "app index": reverse("admin:app_list", args=["django_scheduling"]),
        "task list": TASKS_URL,
    }

    def use_tasks(self, tasks: TaskRegistry) -> None:
        patcher = mock.patch.object(scheduling_checks, "registry", tasks)
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_banner_names_each_error_escaped(self):
        tasks = TaskRegistry()
        tasks.add(job, cron="0 0 25 * * *", name=f"nightly {SCRIPT}")
        tasks.add(job, fixed_rate="often", name="reports.hourly")
        self.use_tasks(tasks)

        for page, url in self.pages.items():
            with self.subTest(page):
                response = self.client.get(url)

                self.assertContains(response, 'id="ds-configuration-errors"', count=1)
                self.assertContains(response, "The scheduler is not running")
                self.assertContains(response, "django_scheduling.E001", count=2)
                self.assertContains(response, "hour value 25 is out of range 0-23")
                self.assertContains(response, "invalid fixed_rate &#x27;often&#x27;")
                self.assertContains(response, f"nightly {ESCAPED_SCRIPT}")
                self.assertNotContains(response, SCRIPT)

    def test_banner_under_runserver_where_the_checks_only_warn(self):
        tasks = TaskRegistry()
        tasks.add(job, cron="0 0 25 * * *", name="nightly")
        self.use_tasks(tasks)
        # runserver serves in spite of the mistake, so its checks say it as a warning; the
        # scheduler does not run all the same, and the banner says so.
        scheduling_checks.report_for("runserver")
        self.addCleanup(scheduling_checks.report_for, None)
        response = self.client.get(TASKS_URL)
        self.assertContains(response, 'id="ds-configuration-errors"', count=1)
        self.assertContains(response, "django_scheduling.E001")

    def test_a_setting_error_is_shown_too(self):
        self.use_tasks(TaskRegistry())

        with override_settings(SCHEDULING={"OVERDUE_AFTER": "soon"}):
            response = self.client.get(TASKS_URL)

        self.assertContains(response, 'id="ds-configuration-errors"')
        self.assertContains(response, "django_scheduling.E004")

    def test_no_banner_when_all_is_well(self):
        tasks = TaskRegistry()
        tasks.add(job, cron="0 0 2 * * *", name="nightly")
        self.use_tasks(tasks)

        for page, url in self.pages.items():
            with self.subTest(page):
                self.assertNotContains(self.client.get(url), "ds-configuration-errors")

    def test_no_banner_for_users_who_cannot_see_the_app(self):
        tasks = TaskRegistry()
        tasks.add(job, cron="0 0 25 * * *", name="nightly")
        self.use_tasks(tasks)
        self.client.force_login(staff_user("nobody"))

        response = self.client.get(reverse("admin:index"))

        self.assertEqual(response.status_code, 200)
        self.assertNotContains(response, "ds-configuration-errors")


class TaskDetailTests(AdminTestCase):
    def test_lists_the_last_twenty_runs_newest_first(self):
        make_task("reports.daily", self.now + timedelta(hours=1))
        runs = [
            make_run("reports.daily", self.now - timedelta(minutes=m)) for m in range(25, 0, -1)
        ]
        make_run("another.task", self.now)

        response = self.client.get(task_url("reports.daily"))

        shown = list(response.context["recent_runs"])
        self.assertEqual(shown, runs[::-1][:20])
        for run in shown:
            self.assertContains(
                response, reverse("admin:django_scheduling_taskrun_change", args=[run.pk])
            )
        self.assertNotContains(
            response, reverse("admin:django_scheduling_taskrun_change", args=[runs[0].pk]) + '"'
        )

    def test_read_only_with_controls_for_a_user_allowed_to_use_them(self):
        make_task("reports.daily", self.now + timedelta(hours=1))

        response = self.client.get(task_url("reports.daily"))

        self.assertNotContains(response, 'name="_save"')
        self.assertNotContains(response, "deletelink")
        self.assertContains(response, f'action="{task_url("reports.daily", "pause")}"')
        self.assertContains(response, f'action="{task_url("reports.daily", "run")}"')
        self.assertNotContains(response, task_url("reports.daily", "resume"))

    def test_paused_task_offers_resume(self):
        make_task("reports.daily", self.now + timedelta(hours=1), paused=True)

        response = self.client.get(task_url("reports.daily"))

        self.assertContains(response, f'action="{task_url("reports.daily", "resume")}"')
        self.assertNotContains(response, task_url("reports.daily", "pause"))

    def test_no_controls_without_permissions(self):
        make_task("reports.daily", self.now + timedelta(hours=1))
        self.client.force_login(self.viewer)

        response = self.client.get(task_url("reports.daily"))

        self.assertEqual(response.status_code, 200)
        self.assertNotContains(response, 'class="ds-tool"')

    def test_removed_task_offers_no_run(self):
        make_task("gone", None, removed_at=self.now)

        response = self.client.get(task_url("gone"))

        self.assertNotContains(response, task_url("gone", "run"))


class ControlViewTests(AdminTestCase):
    name = "app.tasks.send_report_v2"  # dots and underscores: quoted in the URLs

    def setUp(self):
        super().setUp()
        make_task(self.name, self.now + timedelta(hours=1))

    def task(self) -> ScheduledTask:
        return ScheduledTask.objects.get(pk=self.name)

    def test_pause_and_resume(self):
        response = self.client.post(task_url(self.name, "pause"), follow=True)

        self.assertRedirects(response, task_url(self.name))
        self.assertTrue(self.task().paused)
        self.assertContains(response, f"Paused {self.name}")
        self.assertContains(response, '<span class="ds-badge ds-badge--paused">paused</span>')
        entry = LogEntry.objects.get()
        self.assertEqual((entry.object_id, entry.change_message), (self.name, "Paused."))

        response = self.client.post(task_url(self.name, "resume"), follow=True)

        self.assertFalse(self.task().paused)
        self.assertContains(response, f"Resumed {self.name}")

    def test_run_now_requests_a_run(self):
        response = self.client.post(task_url(self.name, "run"), follow=True)

        self.assertRedirects(response, task_url(self.name))
        requested = self.task().run_requested_at
        self.assertIsNotNone(requested)
        self.assertLessEqual(abs(requested - timezone.now()), timedelta(minutes=1))
        self.assertContains(response, f"Requested a run of {self.name} now")
        self.assertEqual(LogEntry.objects.get().change_message, "Requested a run now.")

        # A second click while the first request is pending asks for nothing more.
        response = self.client.post(task_url(self.name, "run"), follow=True)
        self.assertEqual(self.task().run_requested_at, requested)
        self.assertContains(response, "already requested")

    def test_removed_task_is_not_run(self):
        ScheduledTask.objects.filter(pk=self.name).update(removed_at=self.now)

        response = self.client.post(task_url(self.name, "run"), follow=True)

        self.assertIsNone(self.task().run_requested_at)
        self.assertContains(response, "no longer declared")

    def test_get_is_not_allowed(self):
        for view in ("pause", "resume", "run"):
            with self.subTest(view):
                self.assertEqual(self.client.get(task_url(self.name, view)).status_code, 405)
        self.assertFalse(self.task().paused)

    def test_csrf_token_is_required(self):
        client = Client(enforce_csrf_checks=True)
        client.force_login(self.superuser)

        for view in ("pause", "run"):
            with self.subTest(view):
                self.assertEqual(client.post(task_url(self.name, view)).status_code, 403)
        self.assertFalse(self.task().paused)
        self.assertIsNone(self.task().run_requested_at)

    def test_each_control_needs_its_permission(self):
        self.client.force_login(staff_user("pauser", "view_scheduledtask", "pause_scheduledtask"))

        self.assertEqual(self.client.post(task_url(self.name, "run")).status_code, 403)
        self.assertEqual(self.client.post(task_url(self.name, "pause")).status_code, 302)
        self.assertTrue(self.task().paused)

        self.client.force_login(self.viewer)
        for view in ("pause", "resume", "run"):
            with self.subTest(view):
                self.assertEqual(self.client.post(task_url(self.name, view)).status_code, 403)
        self.assertTrue(self.task().paused)
        self.assertIsNone(self.task().run_requested_at)

    def test_unknown_task_is_404(self):
        for view in ("pause", "resume", "run"):
            with self.subTest(view):
                self.assertEqual(self.client.post(task_url("no.such.task", view)).status_code, 404)

    def test_anonymous_user_is_sent_to_the_login_page(self):
        self.client.logout()

        response = self.client.post(task_url(self.name, "pause"))

        self.assertEqual(response.status_code, 302)
        self.assertIn(reverse("admin:login"), response["Location"])
        self.assertFalse(self.task().paused)


class ChangeListActionTests(AdminTestCase):
    def setUp(self):
        super().setUp()
        make_task("a", self.now + timedelta(hours=1))
        make_task("b", self.now - timedelta(hours=1))
        make_task("c", self.now + timedelta(hours=1), paused=True)

    def act(self, action: str, *names: str):
        return self.client.post(
            TASKS_URL, {"action": action, "_selected_action": list(names)}, follow=True
        )

    def test_pause_resume_and_run(self):
        response = self.act("pause_tasks", "a", "b", "c")
        self.assertContains(response, "Paused 2 tasks.")
        self.assertEqual(ScheduledTask.objects.filter(paused=True).count(), 3)

        response = self.act("resume_tasks", "a")
        self.assertContains(response, "Resumed 1 task.")
        self.assertFalse(ScheduledTask.objects.get(pk="a").paused)

        response = self.act("run_tasks", "a", "b")
        self.assertContains(response, "Requested a run of 2 tasks")
        self.assertEqual(
            set(ScheduledTask.objects.filter(run_requested_at__isnull=False).values_list("pk")),
            {("a",), ("b",)},
        )
        self.assertEqual(LogEntry.objects.count(), 5)

    def test_actions_follow_the_permissions(self):
        def actions(user: User) -> set[str]:
            self.client.force_login(user)
            response = self.client.get(TASKS_URL)
            form = response.context["action_form"]
            return {name for name, _label in form.fields["action"].choices if name}

        self.assertEqual(actions(self.superuser), {"pause_tasks", "resume_tasks", "run_tasks"})
        pauser = staff_user("pauser", "view_scheduledtask", "pause_scheduledtask")
        self.assertEqual(actions(pauser), {"pause_tasks", "resume_tasks"})
        runner = staff_user("runner", "view_scheduledtask", "run_scheduledtask")
        self.assertEqual(actions(runner), {"run_tasks"})

        self.client.force_login(self.viewer)
        response = self.client.get(TASKS_URL)
        self.assertNotContains(response, "pause_tasks")
        self.assertNotContains(response, "run_tasks")

    def test_action_without_permission_does_nothing(self):
        self.client.force_login(self.viewer)

        self.act("pause_tasks", "a")

        self.assertFalse(ScheduledTask.objects.get(pk="a").paused)


class TaskRunAdminTests(AdminTestCase):
    def setUp(self):
        super().setUp()
        make_task("reports.daily", self.now + timedelta(hours=1))
        self.failed = make_run(
            "reports.daily",
            self.now - timedelta(minutes=2),
            status=RunStatus.FAILED,
            duration=timedelta(seconds=3),
            error_type="ValueError",
            error_message=f"bad input {SCRIPT}",
            traceback=f'Traceback (most recent call last):\n  File "x.py"\nValueError: {SCRIPT}',
        )
        self.orphan = make_run("gone.task", self.now - timedelta(days=3))

    def run_url(self, run: TaskRun) -> str:
        return reverse("admin:django_scheduling_taskrun_change", args=[run.pk])

    def test_error_text_is_escaped_everywhere(self):
        pages = {
            "run list": self.client.get(RUNS_URL),
            "run detail": self.client.get(self.run_url(self.failed)),
            "task detail": self.client.get(task_url("reports.daily")),
        }
        for page, response in pages.items():
            with self.subTest(page):
                self.assertEqual(response.status_code, 200)
                self.assertNotContains(response, SCRIPT)
                self.assertContains(response, f"bad input {ESCAPED_SCRIPT}")
                self.assertContains(response, "ValueError")

    def test_list_shows_the_error_on_one_line_with_the_whole_text_as_tooltip(self):
        response = self.client.get(RUNS_URL)

        # The message first: a narrow column shows what went wrong before what raised it.
        self.assertContains(
            response,
            '<span class="ds-error ds-one-line" title="ValueError: bad input '
            f'{ESCAPED_SCRIPT}"><span class="ds-error-message">bad input {ESCAPED_SCRIPT}'
            '</span> <span class="ds-error-type">(ValueError)</span></span>',
            html=True,
        )

    def test_detail_shows_the_traceback_in_pre(self):
        response = self.client.get(self.run_url(self.failed))

        self.assertContains(
            response,
            '<pre class="ds-traceback">Traceback (most recent call last):\n  File &quot;x.py&quot;'
            f"\nValueError: {ESCAPED_SCRIPT}</pre>",
        )
        self.assertContains(response, '<span class="ds-badge ds-badge--failed">failed</span>')
        self.assertNotContains(response, 'name="_save"')

    def test_task_name_links_to_the_task_only_if_it_exists(self):
        response = self.client.get(RUNS_URL)

        self.assertContains(
            response,
            f'<a href="{task_url("reports.daily")}">'
            '<span class="ds-name">reports.<wbr>daily</span></a>',
            html=True,
        )
        self.assertContains(response, "gone.task")
        self.assertNotContains(response, task_url("gone.task"))

    def test_filters(self):
        by_task = self.client.get(RUNS_URL, {"task": "gone.task"})
        by_status = self.client.get(RUNS_URL, {"status__exact": "failed"})
        today = self.now - timedelta(hours=1)
        by_date = self.client.get(RUNS_URL, {"started_at__gte": today.isoformat()})

        self.assertEqual(list(by_task.context["cl"].result_list), [self.orphan])
        self.assertEqual(list(by_status.context["cl"].result_list), [self.failed])
        self.assertEqual(list(by_date.context["cl"].result_list), [self.failed])
        self.assertContains(by_task, "?task=reports.daily")  # the filter lists the task names

    def test_read_only(self):
        self.assertEqual(
            self.client.get(reverse("admin:django_scheduling_taskrun_add")).status_code, 403
        )
        delete_url = reverse("admin:django_scheduling_taskrun_delete", args=[self.failed.pk])
        self.assertEqual(self.client.post(delete_url, {"post": "yes"}).status_code, 403)
        self.assertTrue(TaskRun.objects.filter(pk=self.failed.pk).exists())


class BreakableTests(TestCase):
    def test_breaks_after_dots_and_underscores_and_escapes(self):
        self.assertEqual(breakable("app.tasks.send_<b>"), "app.<wbr>tasks.<wbr>send_<wbr>&lt;b&gt;")
        self.assertEqual(breakable("trailing."), "trailing.")


class TaskLockAdminTests(AdminTestCase):
    def test_held_and_expired(self):
        TaskLock.objects.create(
            name="held.one",
            locked_by="worker-a:1",
            locked_at=self.now,
            lock_until=self.now + timedelta(minutes=5),
        )
        TaskLock.objects.create(
            name="expired.one",
            locked_by="worker-b:2",
            locked_at=self.now - timedelta(hours=1),
            lock_until=self.now - timedelta(minutes=55),
        )

        response = self.client.get(LOCKS_URL)

        self.assertContains(response, '<span class="ds-badge ds-badge--held">held</span>', 1)
        self.assertContains(response, '<span class="ds-badge ds-badge--expired">expired</span>', 1)
        self.assertContains(response, "worker-b:2")
        lock_url = reverse("admin:django_scheduling_tasklock_change", args=["held.one"])
        self.assertNotContains(self.client.get(lock_url), 'name="_save"')
        self.assertEqual(
            self.client.get(reverse("admin:django_scheduling_tasklock_add")).status_code, 403
        )
