"""Admin routes (machine token with role admin): projects and jobs (users and
tokens: ``admin_users``)."""
from __future__ import annotations

from flask import current_app, jsonify, request

from app.api import bp
from app.api import validate as v
from app.api.auth import body_limit, require
from app.errors import InvalidJob, InvalidRequest, TooLarge, UnsupportedMediaType
from app.projects import enqueue, jobs_admin, service, source_import
from workers.protocol import SpecError, normalize_jobspec
from workers.source import Limits

MAX_JOBS_PER_BATCH = 10_000


@bp.get("/admin/projects")
def list_projects():
    require("admin")
    return jsonify(projects=service.list_summaries())


@bp.get("/admin/projects/<project_id>")
def get_project(project_id):
    require("admin")
    return jsonify(service.summary(service.get(project_id)))


@bp.route("/admin/projects/<project_id>", methods=["PUT", "PATCH"])
def put_project(project_id):
    require("admin")
    body = v.json_body(body_limit("worker"))
    if "id" in body and body.pop("id") != project_id:
        raise InvalidRequest("id in the body does not match the URL", details={"field": "id"})
    body.pop("policy_version", None)  # owned by the server
    project, created = service.put(project_id, body, partial=request.method == "PATCH")
    return jsonify(service.summary(project)), 201 if created else 200


@bp.delete("/admin/projects/<project_id>")
def delete_project(project_id):
    require("admin")
    service.delete(project_id)
    return "", 204


@bp.post("/admin/projects/<project_id>/jobs")
def enqueue_jobs(project_id):
    require("admin")
    body = v.check(v.json_body(body_limit("enqueue")), {"jobs": lambda value, path: value})
    jobs = body["jobs"]
    if not isinstance(jobs, list) or not 1 <= len(jobs) <= MAX_JOBS_PER_BATCH:
        raise InvalidRequest(f"jobs must be a list of 1..{MAX_JOBS_PER_BATCH} JobSpecs",
                             details={"field": "jobs"})
    project = service.get(project_id)
    specs = []
    for index, raw in enumerate(jobs):
        try:
            specs.append(normalize_jobspec(raw, project.identity_mode))
        except SpecError as exc:
            raise InvalidJob(f"jobs[{index}]: {exc}", details={"index": index, "field": exc.field})
    result = enqueue.enqueue(project_id, specs)
    return jsonify(project_id=project_id, submitted=result.submitted, inserted=result.inserted)


@bp.post("/admin/projects/<project_id>/source")
def enqueue_source(project_id):
    require("admin")
    if request.mimetype != "application/zstd":
        raise UnsupportedMediaType("expected application/zstd", details={"content_type": request.mimetype})
    cfg = current_app.config
    length = request.content_length
    if length is not None and length > cfg["SOURCE_MAX_COMPRESSED"]:
        raise TooLarge("compressed source too large", details={"limit": cfg["SOURCE_MAX_COMPRESSED"],
                                                               "committed": 0})
    limits = Limits(max_compressed=cfg["SOURCE_MAX_COMPRESSED"], max_expanded=cfg["SOURCE_MAX_EXPANDED"],
                    max_jobs=cfg["SOURCE_MAX_JOBS"], max_line=cfg["SOURCE_MAX_LINE"],
                    max_window=cfg["SOURCE_MAX_WINDOW"])
    result = source_import.import_source(project_id, request.stream, limits=limits,
                                         batch_size=cfg["SOURCE_BATCH"])
    return jsonify(jobs=result.jobs, inserted=result.inserted,
                   uncompressed_bytes=result.uncompressed_bytes)


def _decimal(raw: str) -> bool:
    # str.isdigit() also accepts "²" and other digits int() refuses.
    return raw.isascii() and raw.isdigit()


def _job_id(raw: str) -> int:
    if not _decimal(raw) or len(raw) > 18:
        raise InvalidRequest("job id must be a decimal job_id", details={"field": "job_id"})
    return int(raw)


@bp.get("/admin/projects/<project_id>/jobs")
def list_jobs(project_id):
    require("admin")
    service.get(project_id)
    args = request.args
    unknown = set(args) - {"status", "after_job_id", "limit"}
    if unknown:
        raise InvalidRequest(f"unknown query parameter {sorted(unknown)[0]!r}")
    status = args.get("status") or None
    if status is not None and not jobs_admin.valid_status(status):
        raise InvalidRequest("unknown status", details={"field": "status"})
    after = _job_id(args["after_job_id"]) if args.get("after_job_id") else None
    limit_raw = args.get("limit", "100")
    if not _decimal(limit_raw) or not 1 <= int(limit_raw) <= 200:
        raise InvalidRequest("limit must be 1..200", details={"field": "limit"})
    return jsonify(jobs_admin.list_jobs(project_id, status=status, after_job_id=after,
                                        limit=int(limit_raw)))


@bp.get("/admin/projects/<project_id>/jobs/<job_id>")
def show_job(project_id, job_id):
    require("admin")
    return jsonify(jobs_admin.detail(project_id, _job_id(job_id)))


@bp.post("/admin/projects/<project_id>/jobs/<job_id>/requeue")
def requeue_job(project_id, job_id):
    require("admin")
    return jsonify(jobs_admin.requeue(project_id, _job_id(job_id)))


@bp.delete("/admin/projects/<project_id>/jobs/<job_id>")
def delete_job(project_id, job_id):
    require("admin")
    jobs_admin.delete(project_id, _job_id(job_id))
    return "", 204


# The user and machine-token routes register on ``bp`` from their own module.
from app.api import admin_users  # noqa: E402,F401
