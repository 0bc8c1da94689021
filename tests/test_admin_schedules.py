"""The admin of the schedules in the database: choices of what the code allows, validation on
the form, the admin's log, permissions, and moving a code task and back."""

from __future__ import annotations

from unittest import mock

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.test import TestCase, override_settings
from django.urls import reverse

from django_scheduling.models import Schedule
from django_scheduling.tasks.registry import TaskRegistry

from .test_admin import TASKS_URL, make_task, staff_user, task_url
from .testapp.tasks import record_stored

ADD_URL = reverse("admin:django_scheduling_schedule_add")
LIST_URL = reverse("admin:django_scheduling_schedule_changelist")
ALL = ["add_schedule", "change_schedule", "delete_schedule", "view_schedule"]


def nightly():
    pass


def code_tasks() -> TaskRegistry:
    tasks = TaskRegistry()
    tasks.add(nightly, cron="0 0 3 * * *", name="reports.nightly")
    tasks.allow(record_stored, "record")
    return tasks


#: Where the admin, its form and the model's validation read the code's tasks.
REGISTRIES = (
    "django_scheduling.admin.registry",
    "django_scheduling.admin.schedules.registry",
    "django_scheduling.tasks.registry.registry",
)


def use_code_tasks(test: TestCase, tasks: TaskRegistry | None = None) -> None:
    """Give the admin, its form and the model's validation the code tasks *tasks* (by default
    ``code_tasks()``) until *test* ends."""
    tasks = code_tasks() if tasks is None else tasks
    for target in REGISTRIES:
        patcher = mock.patch(target, tasks)
        patcher.start()
        test.addCleanup(patcher.stop)


def change_url(schedule: Schedule) -> str:
    return reverse("admin:django_scheduling_schedule_change", args=[schedule.pk])


def back_url(schedule: Schedule) -> str:
    return reverse("admin:django_scheduling_schedule_back", args=[schedule.pk])


def form_data(**fields) -> dict:
    data = {
        "name": "",
        "task": "",
        "command": "",
        "cron": "",
        "zone": "",
        "fixed_rate": "",
        "fixed_delay": "",
        "initial_delay": "",
        "args": "[]",
        "kwargs": "{}",
        "enabled": "on",
        "missed": "coalesce",
        "jitter": "",
        "lock_at_most_for": "",
        "lock_at_least_for": "",
    }
    data.update(fields)
    return data


@override_settings(SCHEDULING={"COMMANDS": ["scheduling_report"]})
class ScheduleAdminTests(TestCase):
    def setUp(self):
        use_code_tasks(self)
        self.editor = staff_user("editor", *ALL, "view_scheduledtask")
        self.client.force_login(self.editor)

    def test_the_form_offers_what_the_code_allows(self):
        page = self.client.get(ADD_URL).content.decode()
        for option in ("record", "reports.nightly", "scheduling_report"):
            self.assertIn(f'<option value="{option}">{option}</option>', page)
        self.assertNotIn("os.system", page)
        self.assertNotIn('value="flush"', page)

    def test_an_added_schedule_is_saved_and_logged(self):
        response = self.client.post(
            ADD_URL, form_data(name="report", task="record", args='["report"]', cron="0 0 4 * * *")
        )
        self.assertEqual(response.status_code, 302, response.content.decode()[:3000])
        schedule = Schedule.objects.get(name="report")
        self.assertEqual((schedule.task, schedule.args), ("record", ["report"]))
        entry = LogEntry.objects.get(object_id=str(schedule.pk))
        self.assertEqual((entry.action_flag, entry.user), (ADDITION, self.editor))

    def test_a_mistake_shows_on_the_form_and_nothing_is_saved(self):
        cases = [
            (form_data(name="a", task="os.system", fixed_rate="1m"), "task", "valid choice"),
            (form_data(name="b", command="flush", fixed_rate="1m"), "command", "valid choice"),
            (form_data(name="c", task="record", args='["c"]', cron="nope"), "cron", "nope"),
            (form_data(name="d", task="record", fixed_rate="1m"), "args", "label"),
            (form_data(name="e", command="scheduling_report", fixed_rate="1m"), "args", "label"),
        ]
        for data, field, words in cases:
            with self.subTest(field=field, data=data["name"]):
                response = self.client.post(ADD_URL, data)
                self.assertEqual(response.status_code, 200)
                errors = response.context["adminform"].form.errors
                self.assertIn(field, errors)
                self.assertIn(words, " ".join(errors[field]))
        self.assertFalse(Schedule.objects.exists())

    def test_a_change_is_logged_and_disabling_is_an_action(self):
        schedule = Schedule.objects.create(name="r", task="record", args=["r"], fixed_rate="1h")
        response = self.client.post(
            change_url(schedule), form_data(name="r", task="record", args='["r"]', fixed_rate="2h")
        )
        self.assertEqual(response.status_code, 302)
        self.client.post(
            LIST_URL, {"action": "disable_schedules", "_selected_action": [schedule.pk]}
        )
        schedule.refresh_from_db()
        self.assertEqual((schedule.fixed_rate, schedule.enabled), ("2h", False))
        messages = [e.get_change_message() for e in LogEntry.objects.filter(action_flag=CHANGE)]
        self.assertIn("Disabled.", messages)
        self.assertEqual(len(messages), 2)

    def test_staff_without_add_or_change_permission_see_the_schedules_read_only(self):
        schedule = Schedule.objects.create(name="r", task="record", args=["r"], fixed_rate="1h")
        self.client.force_login(staff_user("viewer", "view_schedule"))
        self.assertEqual(self.client.get(ADD_URL).status_code, 403)
        page = self.client.get(change_url(schedule))
        self.assertEqual(page.status_code, 200)
        self.assertNotContains(page, 'name="_save"')
        self.assertEqual(
            self.client.post(change_url(schedule), form_data(name="x")).status_code, 403
        )
        self.assertEqual(self.client.post(back_url(schedule)).status_code, 403)
        self.client.force_login(staff_user("nobody"))
        self.assertEqual(self.client.get(LIST_URL).status_code, 403)

    def test_a_code_task_is_moved_shown_as_moved_and_moved_back(self):
        make_task("reports.nightly", None, trigger="cron 0 0 3 * * * UTC", kind="cron")
        page = self.client.get(task_url("reports.nightly"))
        move = f"{ADD_URL}?name=reports.nightly&amp;override=1"
        self.assertContains(page, move)
        form = self.client.get(f"{ADD_URL}?name=reports.nightly&override=1")
        self.assertTrue(form.context["adminform"].form.initial["override"])
        self.client.post(
            ADD_URL, form_data(name="reports.nightly", override="on", fixed_rate="15m")
        )
        override = Schedule.objects.get(name="reports.nightly", override=True)
        self.assertContains(self.client.get(TASKS_URL), "ds-badge--override")
        page = self.client.get(task_url("reports.nightly"))
        self.assertContains(page, back_url(override))
        self.assertNotContains(page, move)
        # Back to the code's schedule: POST only, the row goes, and the log says who.
        self.assertEqual(self.client.get(back_url(override)).status_code, 405)
        response = self.client.post(back_url(override))
        self.assertRedirects(response, task_url("reports.nightly"))
        self.assertFalse(Schedule.objects.exists())
        entry = LogEntry.objects.get(action_flag=DELETION)
        self.assertEqual((entry.object_repr, entry.user), ("reports.nightly", self.editor))
        self.assertNotContains(self.client.get(TASKS_URL), "ds-badge--override")

    def test_a_row_that_cannot_run_shows_its_error_escaped(self):
        Schedule.objects.create(
            name="evil", task="os.system", fixed_rate="1s", error="<b>'os.system'</b> is not"
        )
        page = self.client.get(LIST_URL)
        self.assertContains(page, "cannot run")
        self.assertContains(page, "&lt;b&gt;")
        self.assertNotContains(page, "<b>'os.system'")
