"""Derive consumers: an archived asset enqueues a job into another project.

A consumer of kind ``derive`` (say on ``papers``, target ``papers-ocr``,
profile ``{"name": "ocr", "languages": "eng+pol"}``) has no URL. Its delivery
for an archived asset is advanced here, in the caller's transaction — the
archive commit's own, where the delivery and its outbox row are written, so
there is no HTTP round trip to ourselves and no window where one exists
without the other:

- the derived job's identity is ``derived_jobs`` (target project, source
  SHA-256, profile): a re-delivered hook finds the row and enqueues nothing;
- the job's ``attr`` carries content facts only (source SHA-256, size,
  pages, profile, languages) — never a URL or a path. A worker that claims
  it asks for a fresh download URL at run time (app/uploads/derived.py);
- the delivery then waits (``awaiting_callback``) until the derived job is
  done, the durable completion rule of every hook: the archive of the
  derived upload closes it (:func:`job_finished`), and its outbox row comes
  due every ``RECHECK_S`` to look again (a failed derived job fails the
  delivery; a vanished one is enqueued again).
"""
from __future__ import annotations

import json
import re

from sqlalchemy import text

from app.errors import Conflict, InvalidJob, InvalidRequest
from app.extensions import db
from app import outbox
from app.projects import enqueue, wakeups
from app.projects.models import Project
from workers.wire.protocol import value_digest

PROFILE_NAME = re.compile(r"\A[a-z0-9][a-z0-9-]{0,31}\Z")
# Tesseract pack names joined by "+", as the OCR worker takes them.
LANGUAGES = re.compile(r"\A[a-z][a-z0-9_]{1,31}(\+[a-z][a-z0-9_]{1,31}){0,7}\Z")
# A waiting delivery looks at its derived job again this often.
RECHECK_S = 300


OPTIONS = ("mode", "deskew", "rotate", "clean", "optimize")
MODES = ("skip-text", "redo", "force")


def check_profile(profile) -> dict:
    """A derive or document OCR profile: ``{"name", "languages"}`` and the
    OCR options ``mode`` (skip-text, redo, force), ``deskew``, ``rotate``,
    ``clean`` (booleans) and ``optimize`` (0 or 1), given only when set."""
    if not isinstance(profile, dict) or set(profile) - {"name", "languages", *OPTIONS}:
        raise InvalidRequest('profile must be an object {"name": ..., "languages": ...} with '
                             f"optional {', '.join(OPTIONS)}", details={"field": "profile"})
    name, languages = profile.get("name"), profile.get("languages", "eng")
    if not isinstance(name, str) or not PROFILE_NAME.match(name):
        raise InvalidRequest("profile.name must be 1..32 of a-z, 0-9 and '-'",
                             details={"field": "profile.name"})
    if not isinstance(languages, str) or not LANGUAGES.match(languages):
        raise InvalidRequest("profile.languages must be Tesseract language names joined by '+' "
                             "(e.g. eng+pol), at most 8", details={"field": "profile.languages"})
    checked = {"name": name, "languages": languages}
    if "mode" in profile:
        if profile["mode"] not in MODES:
            raise InvalidRequest(f"profile.mode must be one of {', '.join(MODES)}",
                                 details={"field": "profile.mode"})
        checked["mode"] = profile["mode"]
    for flag in ("deskew", "rotate", "clean"):
        if flag in profile:
            if not isinstance(profile[flag], bool):
                raise InvalidRequest(f"profile.{flag} must be true or false",
                                     details={"field": f"profile.{flag}"})
            checked[flag] = profile[flag]
    if "optimize" in profile:
        if profile["optimize"] not in (0, 1) or isinstance(profile["optimize"], bool):
            raise InvalidRequest("profile.optimize must be 0 or 1", details={"field": "profile.optimize"})
        checked["optimize"] = profile["optimize"]
    if checked.get("mode") == "redo" and (checked.get("deskew") or checked.get("clean")):
        # OCRmyPDF keeps the page images under --redo-ocr: nothing to straighten or clean.
        raise InvalidRequest("profile.mode redo keeps the page images: deskew and clean need "
                             "mode force", details={"field": "profile.mode"})
    return checked


def options_of(profile: dict) -> dict | None:
    """The OCR options of a checked profile, or None for none."""
    found = {k: profile[k] for k in OPTIONS if k in profile}
    return found or None


def check_target(source_project_id: str, target_project_id) -> str:
    if not isinstance(target_project_id, str) or target_project_id == source_project_id:
        raise InvalidRequest("target_project must name another project",
                             details={"field": "target_project"})
    kind = db.session.execute(text("SELECT kind FROM projects WHERE id = :t"),
                              {"t": target_project_id}).scalar()
    if kind != "pdf":
        raise InvalidRequest("target_project must be an existing pdf project",
                             details={"field": "target_project"})
    return target_project_id


def _job_value(source_value: str | None, canonical_key: str) -> str:
    """The derived job names the same paper as its source (a pdf project's
    jobs name papers); a pruned source job leaves its canonical key."""
    if source_value:
        return source_value
    return canonical_key[4:] if canonical_key.startswith("url:") else canonical_key


def _enqueue(identity_id: int, facts: dict, value: str, target: str) -> tuple[int | None, str]:
    """Insert the derived job through the enqueue path (no commit); (its id,
    why not). An existing job of the same identity in the target project
    (put there by hand, even with other fields) is adopted, not duplicated:
    the insert runs in a savepoint, so its conflict leaves the archive
    commit's transaction intact."""
    project = db.session.get(Project, target)
    if project is None or project.status not in ("active", "draining"):
        return None, f"target project {target} does not take jobs"
    spec = {"id": f"{facts['source_sha256']}:{facts['profile']}", "value": value, "type": "asset",
            "attr": facts}
    try:
        with db.session.begin_nested():
            inserted = enqueue.insert_batch(project, [spec]).inserted
    except (Conflict, InvalidJob) as exc:
        inserted, why = 0, f"could not enqueue into {target}: {exc}"
    else:
        why = f"target project {target} refused the job"
    job_id = db.session.execute(text(
        "SELECT id FROM jobs WHERE project_id = :t AND (ext_id = :e OR value_sha256 = :vs) "
        "ORDER BY id DESC LIMIT 1"),
        {"t": target, "e": spec["id"], "vs": value_digest(value)}).scalar()
    if inserted:
        wakeups.notify(target)
    db.session.execute(text("UPDATE derived_jobs SET job_id = :j WHERE id = :i"),
                       {"j": job_id, "i": identity_id})
    return job_id, why


def identity(target: str, source_sha256: str, profile: str, *, source_key: str,
             source_project_id: str, size: int, pages: int | None, languages: str,
             options: dict | None = None) -> tuple[int, int | None]:
    """The derived-job identity (target, source SHA-256, profile), made if
    new and locked either way; (its id, its job id or None)."""
    return tuple(db.session.execute(text("""
        INSERT INTO derived_jobs (target_project_id, source_sha256, profile, source_key,
                                  source_project_id, source_size, source_pages, languages, options)
        VALUES (:t, :sha, :pr, :k, :sp, :size, :pages, :langs, CAST(:opts AS jsonb))
        ON CONFLICT (target_project_id, source_sha256, profile) DO UPDATE
            SET languages = derived_jobs.languages   -- a no-op that returns the row, locked
        RETURNING id, job_id"""),
        {"t": target, "sha": source_sha256, "pr": profile, "k": source_key, "sp": source_project_id,
         "size": size, "pages": pages, "langs": languages,
         "opts": json.dumps(options) if options else None}).one())


def advance(delivery_id: int) -> str | None:
    """Move one derive delivery forward in the caller's transaction (the
    caller commits); returns its state. Idempotent: any number of
    re-deliveries make one derived job."""
    row = db.session.execute(text("""
        SELECT d.state, d.derived_job_id, c.enabled, c.target_project_id, c.profile,
               a.canonical_key, a.sha256, a.size, a.pages, a.project_id, sj.value
        FROM hook_deliveries d JOIN hook_consumers c ON c.id = d.consumer_id
        JOIN uploads u ON u.attempt_id = d.attempt_id
        JOIN assets a ON a.canonical_key = u.canonical_key
        LEFT JOIN jobs sj ON sj.id = u.job_id
        WHERE d.id = :d FOR UPDATE OF d"""), {"d": delivery_id}).mappings().first()
    if row is None or row["state"] not in ("pending", "awaiting_callback"):
        outbox.done("hook_delivery", delivery_id)
        return row["state"] if row else None
    if not row["enabled"]:
        return _close(delivery_id, "skipped", "consumer disabled")
    profile = row["profile"] or {}
    facts = {"source_sha256": row["sha256"], "size": row["size"], "pages": row["pages"],
             "profile": profile.get("name"), "languages": profile.get("languages", "eng")}
    identity_id, job_id = identity(row["target_project_id"], row["sha256"], facts["profile"],
                                   source_key=row["canonical_key"], source_project_id=row["project_id"],
                                   size=row["size"], pages=row["pages"], languages=facts["languages"],
                                   options=options_of(profile))
    job = None
    if job_id is not None:
        job = db.session.execute(text("SELECT state, last_error FROM jobs WHERE id = :j"),
                                 {"j": job_id}).first()
    if job is None:  # new, or its job was deleted: (re-)enqueue
        job_id, why = _enqueue(identity_id, facts, _job_value(row["value"], row["canonical_key"]),
                               row["target_project_id"])
        if job_id is None:
            return _close(delivery_id, "failed", why)
        job = ("todo", None)
    db.session.execute(text("UPDATE hook_deliveries SET derived_job_id = :i WHERE id = :d"),
                       {"i": identity_id, "d": delivery_id})
    if job[0] == "done":
        return _close(delivery_id, "delivered", None)
    if job[0] == "failed":
        return _close(delivery_id, "failed", f"derived job {job_id} failed: "
                      f"{json.dumps(job[1])[:1500] if job[1] else 'no error recorded'}")
    db.session.execute(text(
        "UPDATE hook_deliveries SET state = 'awaiting_callback', last_error = :e, "
        "awaiting_until = now() + make_interval(secs => :w), updated_at = now() WHERE id = :d"),
        {"d": delivery_id, "w": RECHECK_S,
         "e": f"waiting for derived job {job_id} in {row['target_project_id']}"})
    outbox.defer("hook_delivery", delivery_id, RECHECK_S)
    return "awaiting_callback"


def _close(delivery_id: int, state: str, error: str | None) -> str:
    db.session.execute(text(
        "UPDATE hook_deliveries SET state = :s, last_error = :e, awaiting_until = NULL, "
        "tries = tries + 1, updated_at = now(), "
        "delivered_at = CASE WHEN :s = 'delivered' THEN now() END "
        "WHERE id = :d AND state IN ('pending', 'awaiting_callback')"),
        {"d": delivery_id, "s": state, "e": error})
    outbox.done("hook_delivery", delivery_id)
    return state


def job_finished(job_id: int) -> int:
    """A derived job is done: every delivery waiting for it is delivered
    (caller's transaction). Returns how many."""
    closed = db.session.execute(text("""
        UPDATE hook_deliveries SET state = 'delivered', last_error = NULL, awaiting_until = NULL,
            tries = tries + 1, delivered_at = now(), updated_at = now()
        WHERE derived_job_id IN (SELECT id FROM derived_jobs WHERE job_id = :j)
          AND state IN ('pending', 'awaiting_callback')
        RETURNING id"""), {"j": job_id}).scalars().all()
    for delivery_id in closed:
        outbox.done("hook_delivery", delivery_id)
    return len(closed)


def facts_for_job(job_id: int):
    """The derived_jobs row of a job (source key, sha256, size, pages,
    languages, profile), or None for an ordinary job."""
    return db.session.execute(text(
        "SELECT id, source_key, source_sha256, source_size, source_pages, languages, profile, "
        "source_project_id, target_project_id, options FROM derived_jobs WHERE job_id = :j"),
        {"j": job_id}).mappings().first()
