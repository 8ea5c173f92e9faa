"""Every command FleetHQ's README and docs print runs as written on a
``make dev`` stack (issue "The first day of an operator").

The test starts the development stack (``python -m app.dev --no-demo``, with
the demo's projects put in through the admin API: its fetcher and OCR
lanes take minutes and need the test publisher) in a scratch copy of the
checkout, then runs each ``sh`` block of README.md and docs/*.md in bash
from that copy, file by file, each block starting from the environment the
blocks before it in the same file left (their ``export``s and
``. .venv/bin/activate``). A block that cannot run on such a stack says why
on its first line, ``# needs: …`` (a production host, Docker, a SavewebHQ
database, minutes of benchmark), and is not run; a ``console`` block is a
transcript: its ``$`` lines are the commands. The one change made to a
block: the stack listens on a free port, so ``127.0.0.1:8400`` (make dev's
address) is replaced by it."""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.helpers import stop_group

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(sh|bash|console)\n(.*?)^```", re.S | re.M)
NEEDS = re.compile(r"\A# needs: (\S.*)")
# What the scratch copy of the checkout links to (the make dev stack writes only var/).
LINKED = (".venv", "app", "bench", "docs", "migrations", "tasks", "templates", "tests", "workers", "wsgi.py",
          "pyproject.toml", "Makefile", "babel.cfg", "README.md", "Procfile")
BLOCK_TIMEOUT_S = 120


def blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line, language, text) of each command block of a document."""
    text = path.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def commands(language: str, text: str) -> str:
    if language != "console":
        return text
    return "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ "))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A make dev stack in a scratch copy of the checkout, with the demo's projects."""
    home = tmp_path_factory.mktemp("checkout")
    for name in LINKED:
        (home / name).symlink_to(ROOT / name)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETHQ_", "HQ_")) and k not in (
        "DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")}
    env["FLEETHQ_PORT"] = str(port)
    log = open(home / "devstack.log", "wb")
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "-m", "app.dev", "--no-demo"], cwd=home,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while "is ready at" not in (home / "devstack.log").read_text(errors="replace"):
            assert proc.poll() is None, (home / "devstack.log").read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "make dev's stack did not start in 3 minutes"
            time.sleep(0.5)
        token = (home / "var" / "dev-admin.token").read_text().strip()
        from app.dev import demo, demo_documents
        demo.demo(base, token)  # the generic demo project and its 300 jobs
        demo.api(base, token, "PUT", f"/api/v1/fleethq/projects/{demo.PDF_PROJECT}",
                 {"kind": "pdf", "identity_mode": "unique_value"})
        demo_documents._letter(home / "var")  # the scan the documents demo adds
        yield {"home": home, "base": base, "port": port, "env": env, "token": token}
    finally:
        stop_group(proc, timeout=60)
        log.close()


def _run(stack, script: str, env: dict) -> tuple[subprocess.CompletedProcess, dict]:
    """One block in bash; the environment it ends with comes back for the next."""
    dump = stack["home"] / ".block-env"
    wrapped = f"set -eo pipefail\n{script}\nenv -0 > {dump}\n"
    done = subprocess.run(["bash", "-c", wrapped], cwd=stack["home"], env=env, capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_S)
    after = env
    if done.returncode == 0 and dump.exists():
        after = dict(item.split("=", 1) for item in dump.read_text().split("\0") if "=" in item)
        dump.unlink()
    return done, after


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_block_runs_as_written(stack, doc):
    env = dict(stack["env"])
    failures, ran = [], 0
    for line, language, text in blocks(doc):
        needs = NEEDS.match(text)
        if needs:
            continue
        script = commands(language, text).replace("127.0.0.1:8400", f"127.0.0.1:{stack['port']}")
        done, env = _run(stack, script, env)
        ran += 1
        # curl -s exits 0 on an HTTP error: the master's error envelope tells.
        refused = re.search(r'"error":\s*\{', done.stdout)
        if done.returncode != 0 or refused:
            failures.append(f"{doc.name}:{line} exit {done.returncode}\n{text}\n--- stderr:\n"
                            f"{done.stderr[-1500:]}\n--- stdout:\n{done.stdout[-500:]}")
    assert not failures, "\n\n".join(failures)


def test_a_block_that_cannot_run_says_why():
    for doc in DOCS:
        for line, _language, text in blocks(doc):
            first = text.splitlines()[0] if text.strip() else ""
            if first.startswith("# needs"):
                assert NEEDS.match(text), f"{doc.name}:{line}: '# needs: <what>' names what the block needs"
    assert commands("console", "$ hqctl whoami\n{\"user_id\": \"a\"}\n") == "hqctl whoami"


def test_the_startup_banner_commands_run(stack):
    """What make dev prints under "Try this in another shell:" runs as printed."""
    log = (stack["home"] / "devstack.log").read_text(errors="replace")
    tail = log.split("Try this in another shell:\n", 1)[1]
    printed = []
    for line in tail.splitlines():
        if not line.strip():
            break
        printed.append(line.strip())
    assert len(printed) >= 5 and printed[0].startswith("export HQ_URL=")
    done, _ = _run(stack, "\n".join(printed), dict(stack["env"]))
    assert done.returncode == 0, f"{printed}\n{done.stderr[-2000:]}"
    assert not re.search(r'"error":\s*\{', done.stdout), done.stdout[-2000:]
    assert "fleethq_queue_depth" in done.stdout
