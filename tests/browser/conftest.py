"""The browser test needs Playwright (pip) and a Chromium (Debian: apt-get install chromium).

Without either, every test here is skipped with a message saying what to install. Point
``CHROMIUM`` at another Chromium/Chrome binary if it is not on the PATH.
"""
import os
import shutil

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path():
    wanted = os.environ.get("CHROMIUM")
    if wanted:
        return wanted if os.path.exists(wanted) else None
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


@pytest.fixture(scope="session")
def chromium():
    try:
        import playwright.sync_api  # noqa: F401, PLC0415  optional: only this test needs it
    except ImportError:
        pytest.skip("browser test skipped: Playwright is not installed (pip install playwright)")
    path = chromium_path()
    if path is None:
        pytest.skip("browser test skipped: no Chromium found (Debian/Ubuntu: "
                    "apt-get install chromium; or set CHROMIUM=/path/to/chrome)")
    return path
