"""The worker command the enrollment page prints runs as printed (issue "The
first day of an operator"): on a make dev stack — plain http on loopback, the
version the demo projects accept, the demo's publisher named — it enrolls a
real worker process that fetches a demo paper."""
from __future__ import annotations

import html
import os
import re
import shlex
import shutil
import subprocess

from app.dev.demo import PDF_PROJECT, WORKER_VERSION
from tests.fleet_helpers import decide
from tests.support.pages import Pages, sign_in
from tests.worker_harness import (ROOT, archiver, fleet, master, publisher, sql,  # noqa: F401
                                  wait_for)


def test_the_enrollment_pages_command_runs_verbatim_against_a_dev_stack(
        fleet, publisher, app, client, monkeypatch):
    monkeypatch.setitem(app.config, "DEV_MODE", True)
    monkeypatch.setitem(app.config, "DEV_PUBLISHER_URL", publisher.url)
    # As make dev makes it (app.dev.demo.pdf_demo), with a demo DOI.
    fleet.api.put_project(PDF_PROJECT, kind="pdf", identity_mode="unique_value",
                          client_versions=[WORKER_VERSION])
    assert fleet.api.enqueue(PDF_PROJECT, [{"value": "10.5555/papers/7.pdf"}]).status_code == 200

    sign_in(app, client)
    pages = Pages(client, "page-admin")
    # The address the browser used (the test client's is a placeholder).
    monkeypatch.setitem(app.config, "PUBLIC_URL", fleet.master.url)
    shown = pages.post("/admin/workers/enrollments").get_data(as_text=True)
    command = html.unescape(re.search(r'id="worker-command">([^<]+)</code>', shown).group(1))
    args = shlex.split(command)
    assert args[:2] == [".venv/bin/fleethq-worker", "run"] and "--allow-http" in args, command
    volume = ROOT / args[args.index("--volume") + 1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHQ_")}
    log = open(fleet.tmp_path / "printed-worker.log", "wb")
    proc = subprocess.Popen(args, cwd=ROOT, env={**env, "FLEETHQ_NO_BROWSER": "1"},
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def output():
            return (fleet.tmp_path / "printed-worker.log").read_text(errors="replace")[-3000:]
        node = wait_for(lambda: sql(app, "SELECT id FROM fleet_nodes WHERE status = 'pending'"),
                        30, f"the printed worker's enrollment\n{command}")[0]["id"]
        assert decide(app, node, "approve") == "active"
        wait_for(lambda: fleet.counts(PDF_PROJECT)["done"] == 1, 90,
                 f"the demo paper: {fleet.counts(PDF_PROJECT)}\n{output()}")
        proc.terminate()
        assert proc.wait(30) == 0, output()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        shutil.rmtree(volume, ignore_errors=True)
