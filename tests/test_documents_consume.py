"""The consume folder, as its own process (``flask --app wsgi fleet documents
consume``) against the test database: files dropped in (at the top level and
in a project's subfolder) become documents once they stop growing, then move
to done/; broken ones move to failed/ with their reason beside them; a
consumer killed mid-file loses and duplicates nothing."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from PIL import Image

from tests import scans
from tests.helpers import Api, sql, wait_for
from tests.support.documents import (Consumer, ROOT)  # noqa: F401

WORDS = [["quartz harbour lantern"], ["copper falcon whisper"]]


@pytest.fixture
def projects(client, admin_token, dirs):  # noqa: F811
    api = Api(client, admin_token)
    api.put_project("inbox", kind="documents")
    api.put_project("letters", kind="documents")
    return api


@pytest.fixture
def consumer(database_url, dirs, tmp_path, projects):  # noqa: F811
    made = []

    def start(**kw):
        proc = Consumer(database_url, dirs, tmp_path / "consume", tmp_path / "consume.log", **kw).start()
        made.append(proc)
        return proc
    yield start
    for proc in made:
        if proc.proc.poll() is None:
            proc.proc.kill()


def _documents(app):
    return {(r[0], r[1]) for r in sql(app, "SELECT project_id, filename FROM documents")}


@pytest.mark.parametrize("polling", [0, 1], ids=["inotify", "polling"])
def test_dropped_scans_become_documents_and_move_to_done(app, consumer, tmp_path, polling):
    proc = consumer(polling=polling)
    folder = tmp_path / "consume"
    wait_for(lambda: (folder / "done").is_dir(), 30, f"the consumer to start\n{proc.output()}")
    scans.image_file(folder / "letter.tif", WORDS, "TIFF", mode="1")
    (folder / "letters").mkdir()
    scans.scanned_pdf(folder / "letters" / "scan.pdf", WORDS[:1])
    scans.image_file(folder / "letters" / "receipt.png", WORDS[:1], "PNG", dpi=None)
    (folder / "notes.pdf").write_text("a shopping list, not a scan\n")
    wait_for(lambda: len(_documents(app)) == 3, 60, f"three documents\n{proc.output()}")
    assert _documents(app) == {("inbox", "letter.tif"), ("letters", "scan.pdf"), ("letters", "receipt.png")}
    assert {r[0] for r in sql(app, "SELECT added_via FROM documents")} == {"consume"}
    wait_for(lambda: (folder / "failed" / "notes.pdf").exists(), 30, proc.output())
    reason = (folder / "failed" / "notes.pdf.reason.txt").read_text()
    assert reason.startswith("notes.pdf: not a PDF, TIFF, PNG or JPEG")
    wait_for(lambda: sorted(p.name for p in (folder / "done").iterdir())
             == ["letter.tif", "receipt.png", "scan.pdf"], 30, proc.output())
    assert not [p for p in folder.iterdir() if p.is_file()]
    assert not list((folder / "letters").iterdir()) and not list((folder / ".processing").iterdir())
    proc.stop()


def test_a_file_still_growing_is_left_until_it_stops(app, consumer, tmp_path):
    proc = consumer()
    folder = tmp_path / "consume"
    wait_for(lambda: (folder / "done").is_dir(), 30, proc.output())
    whole = scans.scanned_pdf(tmp_path / "big.pdf", WORDS).read_bytes()
    with open(folder / "slow.pdf", "wb") as out:
        for start in range(0, len(whole), len(whole) // 6 + 1):
            out.write(whole[start:start + len(whole) // 6 + 1])
            out.flush()
            time.sleep(0.5)  # a scanner writing for 3 s; never still for the 1 s settle
            assert not _documents(app), "taken while still growing"
    wait_for(lambda: _documents(app) == {("inbox", "slow.pdf")}, 30, proc.output())
    assert (folder / "done" / "slow.pdf").read_bytes() == whole
    proc.stop()


def test_a_consumer_killed_mid_file_loses_and_duplicates_nothing(app, consumer, tmp_path):
    folder = tmp_path / "consume"
    # A large scan: seconds of checking and converting, time to kill the consumer in it.
    big = Image.new("L", (7000, 9000), 255)
    for n in range(0, 9000, 300):
        big.paste(0, (500, n, 6500, n + 40))
    proc = consumer()
    wait_for(lambda: (folder / "done").is_dir(), 30, proc.output())
    big.save(tmp_path / "large.png", dpi=(300, 300))
    os.rename(tmp_path / "large.png", folder / "large.png")
    wait_for(lambda: list((folder / ".processing").iterdir()), 30, f"the file taken\n{proc.output()}")
    proc.proc.kill()
    proc.proc.wait(10)
    assert not (folder / "done" / "large.png").exists()
    # Killed after its document was made but before the move: the same bytes
    # left in .processing must not become a second document either.
    scans.scanned_pdf(tmp_path / "twice.pdf", WORDS[:1])
    restarted = consumer()
    wait_for(lambda: (folder / "done" / "large.png").exists(), 90, restarted.output())
    assert _documents(app) == {("inbox", "large.png")}
    os.link(tmp_path / "twice.pdf", folder / "once.pdf")
    wait_for(lambda: (folder / "done" / "once.pdf").exists(), 30, restarted.output())
    restarted.proc.kill()
    restarted.proc.wait(10)
    os.link(tmp_path / "twice.pdf", folder / ".processing" / "inbox~once-again.pdf")
    third = consumer()
    wait_for(lambda: (folder / "done" / "once-again.pdf").exists(), 30, third.output())
    assert _documents(app) == {("inbox", "large.png"), ("inbox", "once.pdf")}
    assert sql(app, "SELECT count(*) FROM jobs")[0][0] == 2
    third.stop()


def test_files_without_a_project_are_explained_not_lost(app, consumer, tmp_path, database_url, dirs):  # noqa: F811
    folder = tmp_path / "consume"
    (folder / "nowhere").mkdir(parents=True)
    scans.scanned_pdf(folder / "nowhere" / "scan.pdf", WORDS[:1])
    proc = Consumer(database_url, dirs, folder, tmp_path / "once.log")
    proc.env.pop("FLEETHQ_CONSUME_PROJECT")
    scans.scanned_pdf(folder / "top.pdf", WORDS[:1])
    done = subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "fleet", "documents", "consume",
                           "--once"], cwd=ROOT, env=proc.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "failed top.pdf" in done.stdout and "failed scan.pdf" in done.stdout
    assert "FLEETHQ_CONSUME_PROJECT" in (folder / "failed" / "top.pdf.reason.txt").read_text()
    assert "no project 'nowhere'" in (folder / "failed" / "scan.pdf.reason.txt").read_text() or \
        "nowhere" in (folder / "failed" / "scan.pdf.reason.txt").read_text()
    assert not _documents(app)
