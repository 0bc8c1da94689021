"""A headless Chromium for the browser tests, and a live-server test case that drives it.

Chromium must start: a browser test that cannot run fails, it is never skipped.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles.testing import StaticLiveServerTestCase
from django.urls import reverse
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: A laptop's screen: the admin pages must read well at this width.
WINDOW_SIZE = (1280, 900)
WAIT_SECONDS = 10


def start_chromium(profile_dir: Path) -> WebDriver:
    """Start headless Chromium with its profile in *profile_dir*."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--window-size={WINDOW_SIZE[0]},{WINDOW_SIZE[1]}",
        f"--user-data-dir={profile_dir}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_window_size(*WINDOW_SIZE)
    return driver


class BrowserTestCase(StaticLiveServerTestCase):
    """A live server and one Chromium shared by the tests of the class."""

    browser: WebDriver

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        profile = tempfile.TemporaryDirectory(prefix="scheduling-chromium-")
        cls.addClassCleanup(profile.cleanup)
        cls.browser = start_chromium(Path(profile.name))
        cls.addClassCleanup(cls.browser.quit)

    def setUp(self) -> None:
        super().setUp()
        self.browser.delete_all_cookies()

    def open(self, path: str) -> None:
        self.browser.get(self.live_server_url + path)

    def wait_for(self, css: str) -> WebElement:
        """Return the element matching *css* once it is on the page."""
        locator = (By.CSS_SELECTOR, css)
        return WebDriverWait(self.browser, WAIT_SECONDS).until(
            EC.presence_of_element_located(locator)
        )

    def wait_for_text(self, css: str, text: str) -> WebElement:
        """Return the element matching *css* once it contains *text*."""
        locator = (By.CSS_SELECTOR, css)
        WebDriverWait(self.browser, WAIT_SECONDS).until(
            EC.text_to_be_present_in_element(locator, text)
        )
        return self.browser.find_element(*locator)

    def click_and_wait(self, element: WebElement) -> None:
        """Click *element* and wait until a new page has loaded in place of the one it was on.

        The old document is marked in JavaScript; the wait ends when a complete document
        without the mark is there. (Watching the clicked element go stale is racy in Chromium:
        while the page navigates, it may report the node in ways Selenium does not map to
        ``StaleElementReferenceException``.)
        """
        self.browser.execute_script("window.__dsOldPage = true;")
        element.click()
        WebDriverWait(self.browser, WAIT_SECONDS, ignored_exceptions=(WebDriverException,)).until(
            lambda driver: driver.execute_script(
                "return window.__dsOldPage === undefined && document.readyState === 'complete';"
            )
        )

    def log_in(self, username: str, password: str) -> None:
        """Log in through the admin's login form."""
        self.open(reverse("admin:login"))
        self.wait_for("#id_username").send_keys(username)
        self.browser.find_element(By.ID, "id_password").send_keys(password)
        self.click_and_wait(self.browser.find_element(By.CSS_SELECTOR, "input[type=submit]"))
        self.wait_for("#user-tools")

    def screenshot(self, name: str) -> Path:
        """Save the window as ``<ARTIFACTS>/screenshots/<name>.png``."""
        folder = Path(settings.ARTIFACTS) / "screenshots"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        self.assertTrue(self.browser.save_screenshot(str(path)), f"could not write {path}")
        return path
