"""Documents in a real browser, in both languages: an admin adds scans with
the project page's file field (several at once), then a reader (the
development reader login) lists them, searches their words and opens a hit
at its page. Screenshots land in ``test-artifacts/screenshots/``
(``documents-<lang>-<page>.png``); a CSP violation or a dialog fails."""
from __future__ import annotations

import pytest
import requests

from tests import scans
from tests.browser import SHOTS, browser  # noqa: F401  (fixture)
from tests.helpers import Api, sql
from tests.support.browser import page, site  # noqa: F401  (fixtures)
from tests.support.documents import _ocr_done

WORDS = [["quartz harbour lantern", "meadow thunder violin"], ["copper falcon whisper"]]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_add_scans_then_read_and_search_them(browser, page, site, app, admin_token, dirs,  # noqa: F811
                                             tmp_path, lang):
    Api(requests.Session(), admin_token, base=site.url).put_project("letters", kind="documents")
    letter = scans.image_file(tmp_path / "letter.tif", WORDS, "TIFF", mode="1")
    photo = scans.image_file(tmp_path / "receipt.jpg", [["receipt for one lantern"]], "JPEG")
    page.goto(f"{site.url}/{lang}/admin/projects/letters")
    page.set_input_files("#documents-files", [str(letter), str(photo)])
    page.click("#documents-form button[type=submit]")
    assert ("已添加 2 个" if lang == "zh" else "2 added") in page.locator(".flash").last.inner_text()
    page.screenshot(path=str(SHOTS / f"documents-{lang}-project.png"), full_page=True)
    (letter_id,) = sql(app, "SELECT id FROM documents WHERE filename = 'letter.tif'")[0]
    _ocr_done(app, letter_id, "quartz harbour lantern\nmeadow thunder violin\fcopper falcon whisper\f")

    reader = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    reader.goto(f"{site.url}/{lang}/login")
    reader.click("#dev-reader-login")
    reader.wait_for_url(f"{site.url}/{lang}/documents")
    rows = reader.locator("#documents-list tbody tr")
    assert rows.count() == 2
    reader.screenshot(path=str(SHOTS / f"documents-{lang}-list.png"), full_page=True)
    reader.fill("#documents-q", "falcon")
    reader.click("#documents-search button[type=submit]")
    reader.locator("#documents-results").wait_for()
    reader.screenshot(path=str(SHOTS / f"documents-{lang}-search.png"), full_page=True)
    reader.click("#documents-results a")
    assert reader.locator("#page-2 mark").inner_text() == "falcon"
    assert reader.locator("#document-downloads a").count() == 3
    reader.screenshot(path=str(SHOTS / f"documents-{lang}-document.png"), full_page=True)
    reader.context.close()
