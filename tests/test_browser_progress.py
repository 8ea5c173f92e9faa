"""/progress in a real browser, in both languages (issue "The first day of
an operator"): each project's bar, percentage, rate and time left, and the
leaderboard of the last hour and day."""
from __future__ import annotations

import pytest

from tests.browser import SHOTS, browser  # noqa: F401  (fixture)
from tests.helpers import body
from tests.support.browser import api, page, site  # noqa: F401  (fixtures)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_progress_shows_bars_rates_and_a_leaderboard(page, site, api, lang):  # noqa: F811
    api.put_project("crawl", max_resets=0)
    api.enqueue("crawl", [{"id": f"c{i}", "value": f"https://example.org/c/{i}"} for i in range(8)])
    claimed = body(api.claim("crawl", max_jobs=4, worker_id="laptop-1"))["jobs"]
    body(api.complete("crawl", claimed[:3], worker_id="laptop-1"))
    page.goto(f"{site.url}/{lang}/progress")
    row = page.locator("#progress-crawl")
    # 3 of 8 done: a green part in the bar, 37.5 %, 3 an hour, 5 left: 100 minutes at that rate.
    assert row.locator("svg.progress-bar rect").count() == 2
    cells = row.locator("td").all_inner_texts()
    assert "37.5 %" in cells[1] and cells[2:6] == ["3", "0", "5", "8"]
    assert cells[6] == ("3/h" if lang == "en" else "3/小时")
    assert cells[7].startswith("about 2 hours" if lang == "en" else "约 2")  # 100 minutes, rounded
    board = page.locator("#leaderboard-hour tbody tr")
    assert board.count() == 1
    assert board.first.locator("td").all_inner_texts()[::2] == ["1", "3"]
    assert page.locator("#leaderboard h2").inner_text() == ("Leaderboard" if lang == "en" else "排行榜")
    page.screenshot(path=str(SHOTS / f"progress-{lang}.png"), full_page=True)
