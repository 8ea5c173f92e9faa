"""Admin routes (machine token with role admin): projects and jobs (users and
tokens: ``admin_users``).

The project and job routes answer exactly the v1 contract (DESIGN §6);
FleetHQ's fuller views of the same projects and jobs are in ``fleethq_admin``.
"""
from __future__ import annotations

from contextlib import contextmanager

from flask import current_app, jsonify, request

from app.api import contract
from app.api.base import bp
from app.api import admin_params as params
from app.api import admin_schemas as S
from app.api import validate as v
from app.api.auth import admin_call, require
from app.errors import InvalidJob, InvalidRequest, NotFound, TooLarge, UnsupportedMediaType
from app.projects import enqueue, jobs_admin, service, source_import
from workers.wire.protocol import SpecError, normalize_jobspec
from workers.wire.source import Limits

# Refusals of the contract's admin writes: 400 (also for a wrong state), and
# 409 for identity conflicts and inactive projects.
_REFUSED = (400, 409)

@bp.get("/admin/projects")
@v.declare(responses={200: {"projects": v.array(S.PROJECT_SUMMARY)}},
           operation_id="listAdminProjects", summary="Projects and their job counts")
def list_projects():
    require("admin")
    return jsonify(projects=service.list_summaries(view=service.contract_summary))


@bp.get("/admin/projects/<project_id>")
@v.declare(responses={200: S.PROJECT_SUMMARY}, operation_id="getAdminProject",
           summary="A project and its job counts")
def get_project(project_id):
    require("admin")
    return jsonify(service.contract_summary(service.get(project_id)))


@bp.put("/admin/projects/<project_id>")
@v.declare(body=S.PROJECT_REQUEST, responses={200: S.PROJECT_SUMMARY}, errors=_REFUSED,
           operation_id="putAdminProject", summary="Create a project or change its policy")
def put_project(project_id):
    """The contract's PUT: 200 with the summary on creation and on change."""
    require("admin")
    project, _ = service.put_contract(project_id, contract.json_body())
    return jsonify(service.contract_summary(project))


@bp.delete("/admin/projects/<project_id>")
@v.declare(responses={204: None}, errors=_REFUSED, operation_id="deleteAdminProject",
           summary="Delete a project and its jobs; refused while jobs are in flight")
def delete_project(project_id):
    require("admin")
    service.delete(project_id)
    return "", 204


def _job_list(value, path):
    # No count limit: the 8 MiB body limit bounds a batch.
    if not isinstance(value, list) or not value:
        raise InvalidRequest("jobs must be a non-empty list of JobSpecs", details={"field": path})
    return value


@bp.post("/admin/projects/<project_id>/jobs")
@v.declare(body={"jobs": v.custom(_job_list, v.list_of(S.JOB_SPEC, 1, None))},
           responses={200: S.ENQUEUED}, errors=_REFUSED, operation_id="enqueueAdminProjectJobs")
def enqueue_jobs(project_id):
    """One atomic batch: every job goes in, or (on a conflict) none does."""
    # The caller and the project's plain view in one statement: a second
    # look-up and the ORM object (enqueue reads four of its fields) cost a
    # 1,000-job request about 1.5 of its 11 ms of web CPU.
    project = admin_call(project_id)
    jobs = v.check(contract.json_body(), {"jobs": _job_list})["jobs"]
    if project is None:
        raise service.not_found(project_id)
    specs = []
    for index, raw in enumerate(jobs):
        try:
            specs.append(normalize_jobspec(raw, project.identity_mode))
        except SpecError as exc:
            raise InvalidJob(f"jobs[{index}]: {exc}",
                             details={"index": index, "field": exc.field}) from None
    result = enqueue.enqueue(project, specs)
    return jsonify(project_id=project_id, submitted=result.submitted, inserted=result.inserted)


SOURCE_TYPES = ("application/zstd", "application/octet-stream")


@bp.post("/admin/projects/<project_id>/source")
@v.declare(body=v.Media("application/zstd"), responses={200: S.SOURCE_IMPORTED}, errors=_REFUSED,
           operation_id="enqueueAdminProjectSource",
           description="application/octet-stream is accepted too; body at most 256 MiB")
def enqueue_source(project_id):
    """Stream a jobs-jsonl-zstd-v1 body in, committing batch by batch."""
    require("admin")
    if request.mimetype not in SOURCE_TYPES:
        raise UnsupportedMediaType("source body must be application/zstd", code="invalid_request",
                                   details={"content_type": request.mimetype})
    cfg = current_app.config
    length = request.content_length
    if length is not None and length > cfg["SOURCE_MAX_COMPRESSED"]:
        # Refused before reading, as a body over the limit; a stream that
        # grows past it is a decoding error (400 invalid_job) instead.
        raise TooLarge("compressed source too large", code="invalid_request",
                       details={"limit": cfg["SOURCE_MAX_COMPRESSED"], "committed": 0})
    limits = Limits(max_compressed=cfg["SOURCE_MAX_COMPRESSED"], max_expanded=cfg["SOURCE_MAX_EXPANDED"],
                    max_jobs=cfg["SOURCE_MAX_JOBS"], max_line=cfg["SOURCE_MAX_LINE"],
                    max_window=cfg["SOURCE_MAX_WINDOW"])
    result = source_import.import_source(project_id, request.stream, limits=limits,
                                         batch_size=cfg["SOURCE_BATCH"])
    return jsonify(project_id=project_id, jobs=result.jobs, inserted=result.inserted,
                   uncompressed_bytes=result.uncompressed_bytes)


@bp.get("/admin/projects/<project_id>/jobs")
@v.declare(query=S.JOB_QUERY, responses={200: S.JOB_LIST}, operation_id="listAdminProjectJobs",
           summary="Jobs in job-id order after the cursor")
def list_jobs(project_id):
    require("admin")
    status, after, limit = params.contract_job_query(request.args)
    service.get(project_id)
    return jsonify(jobs_admin.contract_list(project_id, status=status, after_job_id=after,
                                            limit=limit))


@bp.get("/admin/projects/<project_id>/jobs/<job_id>")
@v.declare(responses={200: S.ADMIN_JOB}, errors=(400,), operation_id="getAdminProjectJob",
           summary="One job")
def show_job(project_id, job_id):
    require("admin")
    return jsonify(jobs_admin.contract_detail(project_id, params.job_id(job_id)))


@bp.post("/admin/projects/<project_id>/jobs/<job_id>/requeue")
@v.declare(responses={204: None}, errors=(400,), operation_id="requeueAdminProjectJob",
           summary="Requeue a failed or reset_exhausted job")
def requeue_job(project_id, job_id):
    require("admin")
    with _unknown_job_is_invalid():
        jobs_admin.requeue(project_id, params.job_id(job_id))
    return "", 204


@bp.delete("/admin/projects/<project_id>/jobs/<job_id>")
@v.declare(responses={204: None}, errors=(400,), operation_id="deleteAdminProjectJob",
           summary="Delete a job that is not in flight")
def delete_job(project_id, job_id):
    require("admin")
    with _unknown_job_is_invalid():
        jobs_admin.delete(project_id, params.job_id(job_id))
    return "", 204


@contextmanager
def _unknown_job_is_invalid():
    """SavewebHQ answers requeue and delete of a job it cannot find (or of an
    unknown project) as 400 invalid_request, like a job in the wrong state."""
    try:
        yield
    except NotFound as exc:
        raise InvalidRequest(exc.message, details=exc.details) from None
