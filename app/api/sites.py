"""FleetHQ's admin routes for the fleet's politeness towards sites
(app.sites, docs/politeness.md): limits fleet-wide and per project, groups of
keys, pauses by hand, and the overview with each rule's attempts in flight."""
from __future__ import annotations

from flask import jsonify

from app.api import validate as v
from app.api.auth import body_limit, require
from app.api.base import bp
from app.sites import service

REASON = v.Optional(v.string(500, nullable=True))
SITE_LIMIT_INPUT = {
    "max_in_flight": v.Optional(v.int_range(0, service.MAX_IN_FLIGHT, nullable=True)),
    "max_starts_per_s": v.Optional(v.number(0, service.MAX_STARTS_PER_S, nullable=True, exclusive_lo=True)),
    "reason": REASON,
}
_LIMIT = {"site": v.text, "project_id": v.text.or_null(),
          "max_in_flight": v.int_range(0, service.MAX_IN_FLIGHT, nullable=True),
          "max_starts_per_s": v.number(0, nullable=True, exclusive_lo=True)}
SITE_LIMIT = v.named("FleetHQSiteLimit", _LIMIT)
SITE_GROUP_INPUT = {
    "keys": v.list_of(v.string(service.keys.MAX_KEY_CHARS, min_bytes=1), 0, service.MAX_GROUP_KEYS),
    "reason": REASON,
}
SITE_GROUP = v.named("FleetHQSiteGroup", {"site": v.text, "keys": v.array(v.text)})
SITE_PAUSE_INPUT = {
    "seconds": v.number(1, service.MAX_PAUSE_S),
    "reason": v.string(500, min_bytes=1),
}
SITE_PAUSE = v.named("FleetHQSitePause", {
    "site": v.text, "paused_until": v.number(0), "reason": v.text, "source": v.text})
SITES = v.named("FleetHQSites", {
    "limits": v.array(v.named("FleetHQSiteLimitState", {
        **_LIMIT, "in_flight": v.int_range(0, v.INT64_MAX), "updated_at": v.number(0)})),
    "groups": v.array(SITE_GROUP),
    "pauses": v.array(v.named("FleetHQSitePauseState", {
        "site": v.text, "until": v.number(0), "reason": v.text, "source": v.text,
        "strikes": v.int_range(1, v.INT64_MAX)})),
})


def _body(schema) -> dict:
    return v.check(v.json_body(body_limit("worker")), schema)


@bp.get("/fleethq/sites")
@v.declare(responses={200: SITES}, summary="Site limits with their attempts in flight, groups, pauses")
def fleethq_sites():
    require("admin")
    return jsonify(service.overview())


def _put_limit(site: str, project_id: str | None):
    body = _body(SITE_LIMIT_INPUT)
    return jsonify(service.set_limit(site, project_id=project_id, max_in_flight=body.get("max_in_flight"),
                                     max_starts_per_s=body.get("max_starts_per_s"),
                                     reason=body.get("reason")))


@bp.put("/fleethq/sites/<site>/limit")
@v.declare(body=SITE_LIMIT_INPUT, responses={200: SITE_LIMIT}, errors=(404, 409),
           summary="Limit a site across the fleet (every project's attempts count)")
def fleethq_put_site_limit(site):
    require("admin")
    return _put_limit(site, None)


@bp.put("/fleethq/projects/<project_id>/sites/<site>/limit")
@v.declare(body=SITE_LIMIT_INPUT, responses={200: SITE_LIMIT}, errors=(404, 409),
           summary="Limit a site for one project's jobs (replaces the fleet-wide rule there)")
def fleethq_put_project_site_limit(project_id, site):
    require("admin")
    return _put_limit(site, project_id)


@bp.delete("/fleethq/sites/<site>/limit")
@v.declare(responses={204: None}, errors=(400, 404), summary="Remove a site's fleet-wide limit")
def fleethq_delete_site_limit(site):
    require("admin")
    service.remove_limit(site)
    return "", 204


@bp.delete("/fleethq/projects/<project_id>/sites/<site>/limit")
@v.declare(responses={204: None}, errors=(400, 404), summary="Remove a project's limit on a site")
def fleethq_delete_project_site_limit(project_id, site):
    require("admin")
    service.remove_limit(site, project_id=project_id)
    return "", 204


@bp.put("/fleethq/sites/<site>/group")
@v.declare(body=SITE_GROUP_INPUT, responses={200: SITE_GROUP}, errors=(409,),
           summary="Make a site one publisher of these keys (an empty list dissolves it)")
def fleethq_put_site_group(site):
    require("admin")
    body = _body(SITE_GROUP_INPUT)
    return jsonify(service.set_group(site, body["keys"], reason=body.get("reason")))


@bp.put("/fleethq/sites/<site>/pause")
@v.declare(body=SITE_PAUSE_INPUT, responses={200: SITE_PAUSE}, errors=(409,),
           summary="Pause a site for every worker (a longer pause is kept)")
def fleethq_pause_site(site):
    require("admin")
    body = _body(SITE_PAUSE_INPUT)
    return jsonify(service.pause(site, body["seconds"], reason=body["reason"]))


@bp.delete("/fleethq/sites/<site>/pause")
@v.declare(responses={204: None}, errors=(400, 404), summary="End a site's pause now")
def fleethq_resume_site(site):
    require("admin")
    service.resume(site)
    return "", 204
