"""FleetHQ's own admin routes (machine token with role admin) under
``/api/v1/fleethq/``: the full views of projects and jobs that the v1
contract's admin routes leave out — project kind, every policy field, the
``staged`` count, attempt history, ``not_before`` and ``deadline_at``.

Thin views over the same services as ``admin``; only the shapes differ.
"""
from __future__ import annotations

from flask import jsonify, request

from app.api import admin_params as params
from app.api import admin_schemas as S
from app.api.base import bp
from app.api import validate as v
from app.api.auth import body_limit, require
from app.errors import InvalidRequest
from app.projects import jobs_admin, service


@bp.get("/fleethq/projects")
@v.declare(responses={200: {"projects": v.array(S.FLEETHQ_PROJECT)}},
           summary="Projects, FleetHQ's full view (at most 500)")
def fleethq_list_projects():
    require("admin")
    return jsonify(projects=service.list_summaries())


@bp.get("/fleethq/projects/<project_id>")
@v.declare(responses={200: S.FLEETHQ_PROJECT}, summary="A project, FleetHQ's full view")
def fleethq_get_project(project_id):
    require("admin")
    return jsonify(service.summary(service.get(project_id)))


@bp.route("/fleethq/projects/<project_id>", methods=["PUT", "PATCH"])
@v.declare(body=S.POLICY_INPUT, responses={200: S.FLEETHQ_PROJECT, 201: S.FLEETHQ_PROJECT},
           errors=(409,), methods=["PUT"], operation_id="fleethqPutProject",
           summary="Create (201, with kind) or replace a project's policy")
@v.declare(body=S.POLICY_INPUT, responses={200: S.FLEETHQ_PROJECT}, errors=(409,),
           methods=["PATCH"], operation_id="fleethqPatchProject",
           summary="Change some policy fields")
def fleethq_put_project(project_id):
    """PUT creates (201, with ``kind``) or replaces the policy, resetting
    omitted fields to the kind's defaults; PATCH changes only the given fields."""
    require("admin")
    body = v.json_body(body_limit("worker"))
    if "id" in body and body.pop("id") != project_id:
        raise InvalidRequest("id in the body does not match the URL", details={"field": "id"})
    body.pop("policy_version", None)  # owned by the server
    project, created = service.put(project_id, body, partial=request.method == "PATCH")
    return jsonify(service.summary(project)), 201 if created else 200


@bp.get("/fleethq/projects/<project_id>/jobs")
@v.declare(query=S.FLEETHQ_JOB_QUERY, responses={200: {"jobs": v.array(S.FLEETHQ_JOB),
                                                    "next_after_job_id": v.int_range(1, v.INT64_MAX, nullable=True)}},
           summary="Jobs of every state, cursor paging (unknown parameters are refused)")
def fleethq_list_jobs(project_id):
    require("admin")
    status, after, limit = params.fleethq_job_query(request.args)
    service.get(project_id)
    return jsonify(jobs_admin.list_jobs(project_id, status=status, after_job_id=after, limit=limit))


@bp.get("/fleethq/projects/<project_id>/jobs/<job_id>")
@v.declare(responses={200: S.FLEETHQ_JOB_DETAIL}, errors=(400,),
           summary="A job with its attempt history")
def fleethq_show_job(project_id, job_id):
    require("admin")
    return jsonify(jobs_admin.detail(project_id, params.job_id(job_id)))
