from tests.helpers import Api, body, values


def test_enqueue_claim_complete_roundtrip(client, admin_token):
    api = Api(client, admin_token)
    api.put_project("p1")
    assert body(api.enqueue("p1", values(5))) == {"project_id": "p1", "submitted": 5, "inserted": 5}
    claimed = body(api.claim("p1", max_jobs=3))["jobs"]
    assert [j["id"] for j in claimed] == ["v0", "v1", "v2"]
    results = body(api.complete("p1", claimed))["results"]
    assert {r["status"] for r in results} == {"applied"}
    assert api.counts("p1") == {"todo": 2, "wip": 0, "staged": 0, "done": 3, "failed": 0,
                                "reset_exhausted": 0}
