"""Every time on the pages in the viewer's own zone, UTC on hover (issue "The
first day of an operator"): a reader in Shanghai and one in New York see the
same audit entry at their own clock, in the page's language, and the hover
still carries UTC and the UNIX seconds."""
from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from tests.browser import browser  # noqa: F401  (fixture)
from tests.support.browser import api, site  # noqa: F401  (fixtures)


def _signed_in(browser, site, zone: str):  # noqa: F811
    context = browser.new_context(timezone_id=zone, viewport={"width": 1400, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    tab.goto(f"{site.url}/login")
    tab.click("#dev-login")
    tab.wait_for_url(f"{site.url}/admin")
    return context, tab


@pytest.mark.parametrize("zone,lang,shape", [
    ("Asia/Shanghai", "zh", "{d.year}年{d.month}月{d.day}日 {d:%H:%M}"),
    ("America/New_York", "en", "{d:%Y-%m-%d %H:%M}"),
])
def test_times_show_in_the_viewers_zone_with_utc_on_hover(browser, site, api, zone, lang, shape):  # noqa: F811
    api.put_project("timed")
    context, tab = _signed_in(browser, site, zone)
    try:
        tab.goto(f"{site.url}/{lang}/admin/audit")
        stamp = tab.locator("table.grid time[data-local=text]").first
        utc = datetime.fromisoformat(stamp.get_attribute("datetime").replace("Z", "+00:00"))
        assert abs(datetime.now(UTC) - utc) < timedelta(minutes=5)
        local = utc.astimezone(ZoneInfo(zone))
        shown = stamp.inner_text()
        assert shown.startswith(shape.format(d=local)), shown
        # The zone is named (GMT+8 / EST or GMT-5), not left to guess.
        assert re.search(r"(GMT[+-]\d+|E[SD]T|UTC[+-]\d+)$", shown), shown
        hover = stamp.get_attribute("title")
        assert "UTC" in hover and str(int(utc.timestamp())) in hover
        assert hover.startswith(shown)
        # A relative age ("… ago") keeps its words and gains the local time on hover.
        tab.goto(f"{site.url}/{lang}/admin/users")
        age = tab.locator("time[data-local=hover]").first
        at = datetime.fromisoformat(age.get_attribute("datetime").replace("Z", "+00:00"))
        assert age.get_attribute("title").startswith(shape.format(d=at.astimezone(ZoneInfo(zone))))
        assert "UTC" in age.get_attribute("title") and "UTC" not in age.inner_text()
    finally:
        context.close()
