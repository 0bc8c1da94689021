"""The schedules' admin in a real browser at a laptop's width (1,280 px): the choices of the
form, a validation error where the field is, and the override badge of a moved code task."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from django_scheduling.models import Schedule

from .browser import WINDOW_SIZE, BrowserTestCase
from .test_admin import TASKS_URL, make_task, task_url
from .test_admin_browser import PASSWORD, text
from .test_admin_schedules import ADD_URL, use_code_tasks


@pytest.mark.browser
@override_settings(SCHEDULING={"COMMANDS": ["scheduling_report"]})
class ScheduleBrowserTests(BrowserTestCase):
    def setUp(self):
        super().setUp()
        self.assertEqual(WINDOW_SIZE[0], 1280)
        use_code_tasks(self)
        User.objects.create_superuser("admin", "admin@example.com", PASSWORD)
        self.log_in("admin", PASSWORD)

    def field(self, name: str):
        return self.browser.find_element(By.ID, f"id_{name}")

    def assert_on_screen(self, element) -> None:
        """*element* shows whole within the window's width."""
        left, right = self.browser.execute_script(
            "const box = arguments[0].getBoundingClientRect(); return [box.left, box.right];",
            element,
        )
        width = self.browser.execute_script("return document.documentElement.clientWidth")
        self.assertGreaterEqual(left, 0)
        self.assertLessEqual(right, width)

    def test_the_form_offers_the_choices_and_shows_a_mistake_at_its_field(self):
        self.open(ADD_URL)
        task = Select(self.wait_for("#id_task"))
        self.assertEqual(
            [option.get_attribute("value") for option in task.options],
            ["", "record", "reports.nightly"],
        )
        command = Select(self.field("command"))
        self.assertEqual(
            [option.get_attribute("value") for option in command.options],
            ["", "scheduling_report"],
        )
        self.field("name").send_keys("reports.hourly")
        task.select_by_value("record")
        self.field("args").clear()
        self.field("args").send_keys('["hourly"]')
        self.field("cron").send_keys("0 61 * * * *")
        self.click_and_wait(self.browser.find_element(By.NAME, "_save"))

        error = self.wait_for(".field-cron .errorlist")
        self.assertIn("61", text(error))
        self.assert_on_screen(error)
        self.assertFalse(Schedule.objects.exists())
        cron = self.field("cron")
        cron.clear()
        cron.send_keys("0 5 * * * *")
        self.click_and_wait(self.browser.find_element(By.NAME, "_save"))
        self.wait_for_text(".messagelist .success", "reports.hourly")
        self.assertEqual(Schedule.objects.get().cron, "0 5 * * * *")

    def test_a_moved_code_task_shows_its_override_badge_until_it_is_moved_back(self):
        make_task("reports.nightly", None, trigger="every 15m", kind="fixed_rate")
        make_task("reports.other", None)
        Schedule.objects.create(name="reports.nightly", override=True, fixed_rate="15m")
        self.open(TASKS_URL)
        badge = self.wait_for("#result_list .ds-badge--override")
        self.assertEqual(text(badge), "override")
        self.assert_on_screen(badge)
        self.assertEqual(len(self.browser.find_elements(By.CSS_SELECTOR, ".ds-badge--override")), 1)

        self.open(task_url("reports.nightly"))
        self.wait_for(".field-trigger_text .ds-badge--override")
        self.click_and_wait(self.wait_for("#ds-back-to-code"))
        self.wait_for_text(".messagelist .success", "back on the code's schedule")
        self.assertFalse(Schedule.objects.exists())
        self.assertEqual(self.browser.find_elements(By.CSS_SELECTOR, ".ds-badge--override"), [])
        self.wait_for("#ds-move")
