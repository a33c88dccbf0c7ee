"""Fixtures for the viewer and report tests: a real headless Chromium driven by selenium.

- ``browser``: a selenium Chrome webdriver over Debian's ``/usr/bin/chromium`` and
  ``/usr/bin/chromedriver`` (installed by ``make install-browser``), one per test module; the
  test is skipped, saying why, when either is missing or the browser does not start.
- ``console_errors(driver)``: the browser console's SEVERE entries since the last call (reading
  the log empties it), as strings.

Nothing may leave 127.0.0.1: selenium's driver manager would download a driver and send usage
statistics, so the driver is given by path (``Service``) and ``SE_AVOID_STATS`` is set before
selenium is imported; Chromium's own background traffic is switched off with its flags.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1280, 900)

_QUIET_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
    # no traffic to any other host: updates, sync, metrics, field trials, safe browsing, DNS prefetch
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-sync",
    "--disable-client-side-phishing-detection",
    "--metrics-recording-only",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-pings",
    "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,AutofillServerCommunication",
    "--autoplay-policy=no-user-gesture-required",
]


def _missing() -> str | None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} is not installed (apt-get install {package}, or run `make install-browser` as root)"
    return None


def _start() -> Any:
    os.environ["SE_AVOID_STATS"] = "true"  # before selenium starts: no statistics, no driver download
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium)")
    options = Options()
    options.binary_location = CHROMIUM
    for flag in _QUIET_FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER)
    try:
        driver = webdriver.Chrome(service=service, options=options)
    except Exception as e:  # noqa: BLE001 -- any failure to start the browser is a reason to skip
        pytest.skip(f"chromium did not start: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    driver.set_window_size(*WINDOW)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    return driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (selenium webdriver), shared by the tests of one module."""
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    driver = _start()
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    """The browser console's errors (level SEVERE) since the last call, as strings."""
    return [
        f"{e.get('source', '')}: {e.get('message', '')}"
        for e in driver.get_log("browser")
        if e.get("level") == "SEVERE"
    ]


@pytest.fixture
def console_errors_of() -> Any:
    """``console_errors`` as a fixture, for test modules (which cannot import each other)."""
    return console_errors
