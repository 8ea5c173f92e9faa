"""Debian's Chromium driven by Playwright for page tests (fails, never skips,
when Chromium is missing). The flags are the worker's required set."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.fetch.chromium import REQUIRED_FLAGS

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "screenshots"


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"Chromium is required at {CHROMIUM} (apt-get install chromium)", pytrace=False)
    from playwright.sync_api import sync_playwright
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=REQUIRED_FLAGS)
        yield chromium
        chromium.close()
