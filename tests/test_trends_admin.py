"""The trends in the admin pages, against the database: the chart and figures on a task's page,
the sparkline and last success in the task list, and the timeline page."""

from __future__ import annotations

import re
from datetime import timedelta
from unittest import mock

from django.contrib.admin import site
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_scheduling.admin.trends import recent_runs_of
from django_scheduling.models import RunStatus, ScheduledTask, TaskRun
from django_scheduling.tasks import registry as registry_module
from django_scheduling.tasks.registry import TaskRegistry

from .test_admin import (
    ESCAPED_SCRIPT,
    SCRIPT,
    TASKS_URL,
    AdminTestCase,
    make_run,
    make_task,
    staff_user,
    task_url,
)

TIMELINE_URL = reverse("admin:django_scheduling_scheduledtask_timeline")
#: A task name that needs escaping in HTML and in SVG alike.
NASTY = f"{SCRIPT}&co"
ESCAPED_NASTY = f"{ESCAPED_SCRIPT}&amp;co"


def job():
    pass


def add_runs(name: str, now, statuses, *, duration=timedelta(seconds=1), late=timedelta(0)):
    """Record runs of *name*, one a minute up to *now*, the last status the newest."""
    runs = []
    for index, status in enumerate(statuses):
        started = now - timedelta(minutes=len(statuses) - index)
        runs.append(
            make_run(
                name,
                started,
                status=status,
                scheduled_at=started - late,
                duration=None if status == RunStatus.RUNNING else duration,
                finished_at=None if status == RunStatus.RUNNING else started + duration,
            )
        )
    return runs


class TaskPageTrendsTests(AdminTestCase):
    def test_chart_and_figures_of_the_last_100_runs(self):
        make_task("report", self.now + timedelta(minutes=1))
        add_runs("report", self.now - timedelta(days=1), [RunStatus.SUCCEEDED] * 10)  # older
        statuses = [RunStatus.SUCCEEDED] * 90 + [RunStatus.FAILED] * 8
        statuses += [RunStatus.SUCCEEDED, RunStatus.FAILED]
        add_runs("report", self.now, statuses, duration=timedelta(seconds=2))

        response = self.client.get(task_url("report"))

        page = response.content.decode()
        bars = re.findall(r'<rect class="ds-bar" data-status="(\w+)"', page)
        self.assertEqual(len(bars), 100)
        self.assertEqual(bars[-2:], ["succeeded", "failed"])  # the newest on the right
        stats = response.context["run_stats"]
        self.assertEqual((stats.finished, stats.succeeded), (100, 91))
        self.assertEqual(stats.consecutive_failures, 1)
        self.assertInHTML('<dd id="ds-p50">2.00s</dd>', page)
        self.assertContains(response, '<dd id="ds-success-rate">91%')
        self.assertNotContains(response, 'class="ds-late"')

    def test_late_starts_are_marked_beyond_the_task_jitter(self):
        make_task("late", self.now + timedelta(minutes=1))
        add_runs("late", self.now, [RunStatus.SUCCEEDED] * 3, late=timedelta(seconds=20))

        response = self.client.get(task_url("late"))
        self.assertContains(response, 'class="ds-late"', count=3)
        self.assertContains(response, "started 20.00s late")

        tasks = TaskRegistry()
        tasks.add(job, name="late", fixed_rate="1m", jitter="30s")
        with mock.patch.object(registry_module, "registry", tasks):
            response = self.client.get(task_url("late"))
        self.assertNotContains(response, 'class="ds-late"')  # the jitter delays on purpose

    def test_running_and_enqueued_runs(self):
        make_task("busy", self.now + timedelta(minutes=1))
        add_runs("busy", self.now, [RunStatus.SUCCEEDED, RunStatus.RUNNING])
        make_run("busy", self.now, status="enqueued")

        response = self.client.get(task_url("busy"))

        bars = re.findall(r'<rect class="ds-bar" data-status="(\w+)"', response.content.decode())
        self.assertEqual(bars, ["succeeded", "running", "enqueued"])
        self.assertEqual(response.context["run_stats"].finished, 2)  # an enqueue has ended

    def test_enqueued_runs_are_the_successes_of_an_engine_task(self):
        make_task("engine", self.now + timedelta(minutes=1))
        add_runs("engine", self.now, [RunStatus.FAILED, RunStatus.ENQUEUED] * 5)

        response = self.client.get(task_url("engine"))

        stats = response.context["run_stats"]
        self.assertEqual((stats.finished, stats.succeeded, stats.consecutive_failures), (10, 5, 0))
        self.assertContains(response, '<dd id="ds-success-rate">50%')

    def test_no_runs_no_chart(self):
        make_task("new", self.now + timedelta(minutes=1))
        response = self.client.get(task_url("new"))
        self.assertNotContains(response, "ds-run-chart")
        self.assertContains(response, "No runs recorded yet.", count=2)  # chart and table

    def test_chart_escapes_the_task_name_and_the_status(self):
        make_task(NASTY, self.now + timedelta(minutes=1))
        # A status of 20 characters at most, as the column holds.
        make_run(NASTY, self.now, status="<i>&amp</i>", duration=timedelta(seconds=1))

        response = self.client.get(task_url(NASTY))

        page = response.content.decode()
        self.assertNotIn(SCRIPT, page)
        self.assertNotIn("<i>&amp</i>", page)
        self.assertIn('data-status="&lt;i&gt;&amp;amp&lt;/i&gt;"', page)

    def test_one_query_reads_the_runs_of_the_chart(self):
        make_task("report", self.now + timedelta(minutes=1))
        add_runs("report", self.now, [RunStatus.SUCCEEDED] * 3)
        with CaptureQueriesContext(connection) as few:
            self.client.get(task_url("report"))
        add_runs("report", self.now - timedelta(hours=5), [RunStatus.FAILED] * 150)
        with self.assertNumQueries(len(few)):
            self.client.get(task_url("report"))


class TaskListTrendsTests(AdminTestCase):
    def test_sparkline_of_the_last_20_runs_and_the_last_success(self):
        make_task("flaky", self.now + timedelta(minutes=1))
        make_task("never", self.now + timedelta(minutes=2))
        make_task("idle", self.now + timedelta(minutes=3))
        runs = add_runs("flaky", self.now, [RunStatus.SUCCEEDED, RunStatus.FAILED] * 15)
        add_runs("never", self.now, [RunStatus.FAILED] * 2)

        response = self.client.get(TASKS_URL)

        page = response.content.decode()
        rows = re.findall(r"<tr>.*?</tr>", page, re.S)
        flaky = next(row for row in rows if "flaky" in row)
        ticks = re.findall(r'class="ds-tick" data-status="(\w+)"', flaky)
        self.assertEqual(ticks, ["succeeded", "failed"] * 10)
        last_success = runs[-2].finished_at
        self.assertEqual(
            response.context["cl"].result_list.get(name="flaky").last_success_at, last_success
        )
        self.assertIn("last success: ", flaky)
        never = next(row for row in rows if "never" in row)
        self.assertEqual(never.count('class="ds-tick"'), 2)
        self.assertIn("no success", never)
        idle = next(row for row in rows if ">idle<" in row)
        self.assertNotIn("<svg", idle)

    def test_the_recent_runs_of_a_page_are_read_in_one_query(self):
        def add_task(index: int) -> None:
            name = f"task.{index:02}"
            make_task(name, self.now + timedelta(minutes=index))
            add_runs(name, self.now, [RunStatus.SUCCEEDED, RunStatus.FAILED] * 15)

        add_task(0)
        with CaptureQueriesContext(connection) as one_task:
            self.client.get(TASKS_URL)
        for index in range(1, 10):
            add_task(index)

        with CaptureQueriesContext(connection) as ten_tasks:
            response = self.client.get(TASKS_URL)

        self.assertEqual(len(ten_tasks), len(one_task))
        (sparklines,) = [q["sql"] for q in ten_tasks if "UNION ALL" in q["sql"].upper()]
        self.assertEqual(len(response.context["cl"].result_list), 10)
        # Each task's newest runs, read from the index on (task_name, -started_at): at most 20
        # runs of each, not every run of the page's tasks numbered by a window function.
        upper = sparklines.upper()
        self.assertNotIn("ROW_NUMBER", upper)
        self.assertNotIn(" OVER ", upper)
        self.assertEqual(upper.count("UNION ALL"), 9)
        self.assertEqual(len(re.findall(r"\bLIMIT 20\b", upper)), 10)
        if connection.vendor == "sqlite":
            with connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN QUERY PLAN {sparklines}")
                reads = [row[3] for row in cursor.fetchall() if "taskrun" in row[3]]
            self.assertEqual(
                reads,
                ["SEARCH django_scheduling_taskrun USING INDEX ds_run_task_started (task_name=?)"]
                * 10,
            )

    def test_the_last_success_of_each_task_is_read_from_an_index(self):
        # The plan of the task list's query: each task's newest success is found by a search
        # of the index on (task_name, status, started_at), not by a scan of the runs.
        statuses = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.ENQUEUED] * 20
        TaskRun.objects.bulk_create(
            TaskRun(
                task_name=f"task.{task:02}",
                started_at=self.now - timedelta(minutes=minute),
                finished_at=self.now - timedelta(minutes=minute),
                status=status,
                instance="web-1:100",
            )
            for task in range(20)
            for minute, status in enumerate(statuses)
        )
        for task in range(20):
            make_task(f"task.{task:02}", self.now + timedelta(minutes=1))
        request = RequestFactory().get(TASKS_URL)
        request.user = self.superuser
        tasks = site._registry[ScheduledTask].get_queryset(request)

        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":  # on a table this small, a scan costs less
                cursor.execute("SET LOCAL enable_seqscan = off")
            plan = tasks.explain()

        if connection.vendor == "sqlite":  # rows of "id parent notused detail"
            rows = [line.split(" ", 3) for line in plan.splitlines()]
            searches = {parent for _, parent, _, detail in rows if "ds_run_task_status" in detail}
            self.assertEqual(len(searches), 4, plan)  # two statuses, each in two places
            for _, parent, _, detail in rows:
                if parent in searches:  # each subquery reads one row: no sort
                    self.assertIn("(task_name=? AND status=?)", detail)
        elif connection.vendor == "mysql":  # id select_type table type possible_keys key ...
            # Which key MariaDB takes depends on the table's statistics, which a test's
            # transaction cannot refresh (ANALYZE TABLE commits): the index must be usable.
            runs = [line.split() for line in plan.splitlines() if "ds_run_task_status" in line]
            self.assertEqual(len(runs), 4, plan)
            for row in runs:
                possible_keys = row[row.index("U0") + 2].split(",")
                self.assertIn("ds_run_task_status_started", possible_keys, plan)
        else:
            self.assertIn("ds_run_task_status_started", plan)
            self.assertNotIn("ds_run_status_started", plan)

    def test_the_last_success_of_an_engine_task_is_its_last_enqueue(self):
        make_task("engine", self.now + timedelta(minutes=1))
        runs = add_runs("engine", self.now, [RunStatus.ENQUEUED, RunStatus.FAILED])

        response = self.client.get(TASKS_URL)

        task = response.context["cl"].result_list.get(name="engine")
        self.assertEqual(task.last_success_at, runs[0].finished_at)
        row = next(
            r for r in re.findall(r"<tr>.*?</tr>", response.content.decode(), re.S) if "engine" in r
        )
        self.assertIn("last success: ", row)
        self.assertNotIn("no success", row)

    def test_recent_runs_of_names_newest_first_per_task(self):
        add_runs("a", self.now, [RunStatus.FAILED] * 25 + [RunStatus.SUCCEEDED])
        add_runs("b", self.now, [RunStatus.SUCCEEDED])
        add_runs("c", self.now, [RunStatus.SUCCEEDED])

        found = recent_runs_of(["a", "b", "missing"], using="default", limit=20)

        self.assertEqual(sorted(found), ["a", "b", "missing"])
        self.assertEqual(len(found["a"]), 20)
        self.assertEqual(found["a"][0][1], "succeeded")
        starts = [run[2] for run in found["a"]]
        self.assertEqual(starts, sorted(starts, reverse=True))
        self.assertEqual(len(found["b"]), 1)
        self.assertEqual(found["missing"], [])


class TimelineTests(AdminTestCase):
    def use_tasks(self, *declarations: tuple[str, dict]) -> TaskRegistry:
        """Declare tasks in code and give them rows, as a scheduler's start-up does."""
        from django_scheduling.storage.task_rows import sync_tasks

        tasks = TaskRegistry()
        for name, options in declarations:
            tasks.add(job, name=name, **options)
        patcher = mock.patch.object(registry_module, "registry", tasks)
        patcher.start()
        self.addCleanup(patcher.stop)
        from datetime import UTC

        sync_tasks(
            [(d.name, d.trigger(UTC)) for d in tasks],
            now=self.now,
            using="default",
            complete=False,
        )
        return tasks

    def test_firings_of_the_next_24_hours_with_collisions(self):
        self.use_tasks(
            ("hourly.a", {"cron": "0 0 * * * *"}),
            ("hourly.b", {"cron": "0 0 * * * *"}),
            ("daily", {"cron": "0 30 6 * * *"}),
            ("quarter", {"cron": "0 */15 * * * *"}),
        )

        response = self.client.get(TIMELINE_URL)

        self.assertEqual(response.status_code, 200)
        timeline = response.context["timeline"]
        counts = {}
        for firing in timeline.firings:
            counts[firing.name] = counts.get(firing.name, 0) + 1
        self.assertEqual(counts, {"hourly.a": 24, "hourly.b": 24, "daily": 1, "quarter": 96})
        minutes = response.context["minutes"]
        top = max(minutes, key=lambda item: item[0].count)[0]
        self.assertEqual((top.count, top.together), (3, 3))  # on the hour
        self.assertContains(response, 'id="ds-timeline-strip"')
        self.assertContains(response, "ds-slot--collision")
        self.assertContains(response, "145 firings of 4 tasks")

    def test_paused_removed_capped_and_unknown_tasks(self):
        self.use_tasks(("fast", {"fixed_rate": "1s"}), ("paused", {"fixed_rate": "1h"}))
        ScheduledTask.objects.filter(name="paused").update(paused=True)
        make_task("gone", self.now + timedelta(hours=1), removed_at=self.now)
        make_task("elsewhere", self.now + timedelta(minutes=10), trigger="every 2h")

        response = self.client.get(TIMELINE_URL)

        names = {firing.name for firing in response.context["timeline"].firings}
        self.assertEqual(names, {"fast", "elsewhere"})
        self.assertContains(response, "1 paused task is left out.")
        self.assertContains(response, "Tasks cut at 1440 firings")
        # The fast task's 1,440 firings end the timeline at 23 min 59 s: its title says so.
        self.assertContains(response, "<title>Timeline of the next 23 minutes")
        self.assertContains(response, "Tasks shown at their next fire time only")

    def test_task_names_are_escaped(self):
        self.use_tasks((NASTY, {"cron": "0 0 * * * *"}), ("other", {"cron": "0 0 * * * *"}))

        response = self.client.get(TIMELINE_URL)

        page = response.content.decode()
        self.assertNotIn(SCRIPT, page)
        self.assertIn(ESCAPED_NASTY, page)

    def test_links_from_the_task_list_and_the_app_index(self):
        make_task("t", self.now + timedelta(minutes=1))
        for url in (TASKS_URL, reverse("admin:app_list", args=["django_scheduling"])):
            with self.subTest(url):
                self.assertContains(self.client.get(url), f'href="{TIMELINE_URL}"')

    def test_staff_with_the_view_permission_only(self):
        self.client.logout()
        response = self.client.get(TIMELINE_URL)
        self.assertEqual(response.status_code, 302)
        self.assertIn(reverse("admin:login"), response["Location"])

        self.client.force_login(staff_user("runs-only", "view_taskrun"))
        self.assertEqual(self.client.get(TIMELINE_URL).status_code, 403)

        self.client.force_login(self.viewer)
        self.assertEqual(self.client.get(TIMELINE_URL).status_code, 200)

    def test_get_only(self):
        self.assertEqual(self.client.post(TIMELINE_URL).status_code, 405)

    def test_long_lists_of_tasks_are_cut_at_50_names(self):
        for index in range(53):
            make_task(f"elsewhere.{index:02}", self.now + timedelta(hours=1), trigger="every 1h")

        response = self.client.get(TIMELINE_URL)

        self.assertContains(response, "elsewhere.49")
        self.assertNotContains(response, "elsewhere.50<")
        self.assertContains(response, "and 3 more")
