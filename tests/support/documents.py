"""Documents: the admin API with a documents project (``api``), the
consume-folder process (``Consumer``) and what the archive commit does when
a document's OCR run is done (``_ocr_done``)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import Api, sql


ROOT = Path(__file__).resolve().parents[2]  # the checkout


class Consumer:
    def __init__(self, database_url, dirs, folder: Path, log: Path, *, polling: int = 0):  # noqa: F811
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLEETHQ_")},
                    "DATABASE_URL": database_url, "FLEETHQ_SECRET_KEY": "consume-test-key",
                    "FLEETHQ_DATA_DIR": str(dirs.spool.parent), "FLEETHQ_SPOOL_DIR": str(dirs.spool),
                    "FLEETHQ_OBJECT_STORE_DIR": str(dirs.objects), "FLEETHQ_CONSUME_DIR": str(folder),
                    "FLEETHQ_CONSUME_PROJECT": "inbox", "FLEETHQ_CONSUME_SETTLE_S": "1",
                    "FLEETHQ_CONSUME_POLLING_S": str(polling), "FLEETHQ_LOG_JSON": "false"}
        self.log, self.proc = log, None

    def start(self) -> "Consumer":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "wsgi", "fleet", "documents", "consume"],
            cwd=ROOT, env=self.env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(20) == 0, self.output()


def _ocr_done(app, document_id: int, text: str) -> None:
    """What the archive commit does when the OCR run of a document is done:
    its text indexed under the document's key, the OCRed PDF registered."""
    from app.extensions import db
    from app.search.index import index_paper
    (key, project, job_id) = sql(app, "SELECT asset_key, project_id, job_id FROM documents WHERE id = :d",
                                 d=document_id)[0]
    sql(app, "INSERT INTO assets (canonical_key, sha256, size, object_key, project_id, derived_from) "
             "SELECT 'ocr:' || canonical_key, sha256, size, object_key, project_id, canonical_key "
             "FROM assets WHERE canonical_key = :k", k=key)
    sql(app, "UPDATE jobs SET state = 'done' WHERE id = :j", j=job_id)
    with app.app_context():
        index_paper(key, project, text, derived_key=f"ocr:{key}", languages="eng")
        db.session.commit()
        db.session.remove()


@pytest.fixture
def api(client, admin_token, dirs):
    """The admin API, with a documents project ``docs`` to put files in."""
    api = Api(client, admin_token)
    api.put_project("docs", kind="documents")
    return api
