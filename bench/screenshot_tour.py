"""A screenshot tour of every page, in English and Chinese, of a running
FleetHQ in development mode (``make dev``): what a new operator sees.

    python bench/screenshot_tour.py                       # the make dev stack of this checkout
    python bench/screenshot_tour.py --url http://127.0.0.1:8400 --phone --zone Asia/Shanghai

It signs in with the development sign-in, finds a project of each kind, a
job, a failed job, a node, a token worker and a document through the admin
API (the dev admin's token in var/dev-admin.token), and saves one full-page
PNG per page and language in ``--out`` (default test-artifacts/tour), then
prints a summary line. Look at the pictures: a page is done when it answers
its question at a glance in both languages. Needs Debian's Chromium
(/usr/bin/chromium); the time zone is the viewer's (--zone), since pages
show times in it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import quote

import requests

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"


def stack_url() -> str:
    try:
        return json.loads((ROOT / "var" / "devstack.json").read_text())["web_url"]
    except (OSError, ValueError, KeyError):
        return "http://127.0.0.1:8400"


def admin_api(url: str, token_file: Path):
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"

    def get(path: str, **params):
        answer = session.get(url + "/api/v1" + path, params=params, timeout=30)
        answer.raise_for_status()
        return answer.json()
    return get


def pages(url: str, token_file: Path) -> list[tuple[str, str]]:
    """(name, path) of every page, with real ids where the data has them."""
    tour = [("dashboard", "/admin"), ("projects", "/admin/projects"), ("workers", "/admin/workers"),
            ("sites", "/admin/sites"), ("users", "/admin/users"), ("hooks", "/admin/hooks"),
            ("search", "/admin/search"), ("audit", "/admin/audit"), ("documents", "/documents"),
            ("progress", "/progress"), ("my-worker", "/worker")]
    get = admin_api(url, token_file)
    projects = get("/fleethq/projects")["projects"]
    for project in projects:
        pid = project["id"]
        tour.append((f"project-{pid}", f"/admin/projects/{quote(pid)}"))
    busiest = max(projects, key=lambda p: sum(p["job_counts"].values()), default=None)
    if busiest:
        pid = quote(busiest["id"])
        tour.append(("job-search", f"/admin/projects/{pid}/jobs/search"))
        jobs = get(f"/admin/projects/{pid}/jobs", limit=1).get("jobs", [])
        if jobs:
            tour.append(("job", f"/admin/jobs/{jobs[0]['job_id']}"))
    for project in projects:
        if project["job_counts"].get("failed"):
            pid = quote(project["id"])
            failed = get(f"/admin/projects/{pid}/jobs", status="failed", limit=1).get("jobs", [])
            if failed:
                tour.append(("failed-job", f"/admin/jobs/{failed[0]['job_id']}"))
                tour.append(("search-by-error", f"/admin/projects/{pid}/jobs/search?state=failed"))
            break
    for worker in get("/admin/fleet/workers")["workers"]:
        if worker["kind"] == "node" and not any(n == "node" for n, _ in tour):
            tour.append(("node", f"/admin/workers/node/{quote(worker['worker_id'])}"))
        if worker["kind"] == "token" and not any(n == "token-worker" for n, _ in tour):
            page = f"/admin/workers/token/{quote(worker['user_id'])}/{quote(worker['worker_id'])}"
            tour.append(("token-worker", page))
            tour.append(("token-worker-revoke", page + "?action=revoke"))
    for project in projects:
        if project["kind"] == "documents":
            found = get(f"/fleethq/projects/{quote(project['id'])}/documents", limit=1)["documents"]
            if found:
                tour.append(("document", f"/documents/{found[0]['document_id']}"))
                break
    tour.append(("search-results", "/admin/search?q=garden"))
    return tour


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="the master (default: this checkout's make dev stack)")
    parser.add_argument("--token-file", default=str(ROOT / "var" / "dev-admin.token"))
    parser.add_argument("--out", default=str(ROOT / "test-artifacts" / "tour"))
    parser.add_argument("--phone", action="store_true", help="a 390-pixel-wide phone screen")
    parser.add_argument("--zone", default="UTC", help="the viewer's time zone (IANA name)")
    args = parser.parse_args()
    url = (args.url or stack_url()).rstrip("/")
    if not os.access(CHROMIUM, os.X_OK):
        sys.exit(f"Chromium is needed at {CHROMIUM} (apt-get install chromium)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tour = pages(url, Path(args.token_file))
    from playwright.sync_api import sync_playwright
    started, shots = time.monotonic(), []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 390 if args.phone else 1400, "height": 900},
                                      timezone_id=args.zone)
        tab = context.new_page()
        tab.goto(url + "/login")
        tab.click("#dev-login")
        tab.wait_for_load_state()
        for lang in ("en", "zh"):
            for name, path in tour:
                answer = tab.goto(f"{url}/{lang}{path}")
                tab.wait_for_load_state("networkidle")
                shot = out / f"{lang}-{name}{'-phone' if args.phone else ''}.png"
                tab.screenshot(path=str(shot), full_page=True)
                shots.append(shot)
                print(f"{answer.status if answer else '?'} {shot}", flush=True)
        browser.close()
    print(f"screenshot_tour pages={len(tour)} languages=2 shots={len(shots)} "
          f"seconds={time.monotonic() - started:.0f} out={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
