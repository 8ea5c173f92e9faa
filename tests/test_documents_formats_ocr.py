"""Every kind of scan the issue names, dropped into the consume folder (the
consume process), OCRed by a real ``fleethq-worker run --task ocr``
(Tesseract), and then found by its own word and read by a reader: PDF,
single and multi-page bilevel TIFF, greyscale and 4-bit TIFF, PNG with and
without DPI, colour PNG, JPEG, a skewed page, a page scanned sideways, a
large page, and a blank page (done, with no words)."""
from __future__ import annotations

import os

from PIL import Image

from tests import scans
from tests.helpers import body, wait_for
from tests.support.pages import sign_in
from tests.support.documents import Consumer
from tests.support.ocr import _ocr_worker
from tests.worker_harness import archiver, fleet, master, publisher, sql  # noqa: F401


def _scans(d):
    pages = lambda word: [[f"{word} the letter reads", "in plain words"]]  # noqa: E731
    made = {
        "scan.pdf": scans.scanned_pdf(d / "scan.pdf", pages("quartz")),
        "bilevel.tif": scans.image_file(d / "bilevel.tif", pages("harbour"), "TIFF", mode="1"),
        "multi.tif": scans.image_file(d / "multi.tif", pages("meadow") + [["second page here"]],
                                      "TIFF", mode="1"),
        "grey.tif": scans.image_file(d / "grey.tif", pages("violin"), "TIFF"),
        "four-bit.tif": scans.image_file(d / "four-bit.tif", pages("falcon"), "TIFF", mode="P4"),
        "no-dpi.png": scans.image_file(d / "no-dpi.png", pages("granite"), "PNG", dpi=None),
        "colour.png": scans.image_file(d / "colour.png", pages("orchid"), "PNG", mode="RGB"),
        "photo.jpg": scans.image_file(d / "photo.jpg", pages("sailor"), "JPEG", quality=92),
    }
    skewed = scans.page_image(["thunder the letter reads", "in plain words"], rotate=3)
    skewed.save(d / "skewed.tif", dpi=(150, 150))
    large = Image.new("L", (3508, 4961), 255)  # A4 at 600 dpi
    large.paste(scans.page_image(["lantern the letter reads", "in plain words"]), (400, 400))
    large.save(d / "large.png", dpi=(600, 600))
    sideways = scans.page_image(["tempest the letter reads", "in plain words"], rotate=90)
    sideways.save(d / "sideways.tif", dpi=(150, 150))
    Image.new("L", (1240, 1754), 255).save(d / "blank.png", dpi=(150, 150))
    made.update({"skewed.tif": d / "skewed.tif", "sideways.tif": d / "sideways.tif",
                 "large.png": d / "large.png", "blank.png": d / "blank.png"})
    return made


WORDS = {"scan.pdf": "quartz", "bilevel.tif": "harbour", "multi.tif": "meadow", "grey.tif": "violin",
         "four-bit.tif": "falcon", "no-dpi.png": "granite", "colour.png": "orchid", "photo.jpg": "sailor",
         "skewed.tif": "thunder", "sideways.tif": "tempest", "large.png": "lantern"}


def test_every_scan_format_dropped_in_is_ocred_searchable_and_readable(fleet, database_url, client,
                                                                        tmp_path):
    project = "inbox"
    fleet.api.put_project(project, kind="documents", retry_backoff_seconds=0)
    made = _scans(tmp_path)
    cfg = fleet.app.config
    dirs = type("Dirs", (), {"spool": tmp_path / "master-data" / "spool",
                             "objects": tmp_path / "objects"})
    consumer = Consumer(database_url, dirs, tmp_path / "consume", tmp_path / "consume.log")
    consumer.env["FLEETHQ_DATA_DIR"] = cfg["DATA_DIR"]
    consumer.start()
    try:
        folder = tmp_path / "consume"
        wait_for(lambda: (folder / "done").is_dir(), 30, consumer.output())
        for name, path in made.items():
            os.link(path, folder / f".{name}")
            os.rename(folder / f".{name}", folder / name)
        worker = _ocr_worker(fleet, project, FLEETHQ_CONCURRENCY=2)
        wait_for(lambda: len(sql(fleet.app, "SELECT 1 FROM documents")) == len(made), 60,
                 consumer.output())
        counts = fleet.wait_settled(project, len(made), timeout=300, proc=worker)
        assert counts["done"] == len(made), worker.output()[-4000:]
    finally:
        consumer.stop()
    assert sorted(os.listdir(folder / "done")) == sorted(made)
    docs = {d["filename"]: d for d in body(fleet.api.call(
        "GET", f"/api/v1/fleethq/projects/{project}/documents?limit=50"))["documents"]}
    assert {n: d["state"] for n, d in docs.items()} == {n: "done" for n in made}
    for name, word in WORDS.items():
        hits = body(fleet.api.call("GET", f"/api/v1/fleethq/documents/search?q={word}"))["results"]
        assert [h["filename"] for h in hits] == [name], (name, word, hits)
    assert docs["multi.tif"]["pages"] == 2
    blank = body(fleet.api.call("GET", f"/api/v1/fleethq/documents/{docs['blank.png']['document_id']}"
                                "/pages"))
    assert blank["pages"] == 1
    assert "".join(s["text"] for page in blank["text"] for s in page["segments"]).strip() == "", blank
    # A reader opens one at its page, the word marked, and downloads the OCRed PDF.
    sign_in(fleet.app, client, "rita", roles=("reader",))
    shown = client.get(f"/documents/{docs['skewed.tif']['document_id']}?q=thunder").get_data(as_text=True)
    assert "<mark>thunder</mark>" in shown
    ocr = client.get(f"/documents/{docs['large.png']['document_id']}/file/ocr")
    assert ocr.status_code == 200 and ocr.data.startswith(b"%PDF")
