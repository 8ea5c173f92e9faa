"""Hook consumers registered through the API and the deliveries they get."""
from __future__ import annotations

from tests.helpers import body
from tests.support.archive import Pipeline, rows


def add_consumer(pipeline: Pipeline, url: str, name: str = "indexer", **extra) -> dict:
    response = pipeline.api.call("POST", f"/api/v1/admin/projects/{pipeline.project}/hooks",
                                 {"name": name, "url": url, **extra})
    assert response.status_code == 201, body(response)
    return body(response)


def delivery_ids(app) -> list[int]:
    return [r["id"] for r in rows(app, "SELECT id FROM hook_deliveries ORDER BY id")]
