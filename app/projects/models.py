"""Tables of the job queue.

``jobs`` carries the current state; ``attempts`` the history of claims.
``job_counts`` and ``attempt_totals`` are insert-only delta tables maintained
by statement-level triggers (see the first migration), so project summaries
and metrics never scan ``jobs`` and concurrent writers never contend on one
counter row; ``app.projects.counters`` folds them periodically.
"""
from __future__ import annotations

from sqlalchemy import (BigInteger, Boolean, CheckConstraint, DateTime, Double, ForeignKey,
                        Index, Integer, LargeBinary, String, Text, func, text)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import Model
from workers.wire.policy import PROJECT_KINDS

# Kinds whose jobs finish through an archived PDF upload: ``pdf`` (papers a
# fetch worker downloads) and ``documents`` (OCR runs of files people put in).
UPLOAD_KINDS = ("pdf", "documents")
JOB_STATES = ("todo", "wip", "staged", "done", "failed", "reset_exhausted")
ATTEMPT_STATES = ("running", "uploading", "staged", "done", "failed", "expired", "cancelled")


def savewebhq_state(state: str) -> str:
    """A job state as SavewebHQ's contract names it: it knows no ``staged``
    (an upload waiting for its archive commit), which is still work in progress."""
    return "wip" if state == "staged" else state


def _in(column: str, values) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Project(Model):
    __tablename__ = "projects"
    __table_args__ = (
        CheckConstraint(_in("kind", PROJECT_KINDS), name="kind"),
        CheckConstraint("status IN ('active', 'draining', 'archived')", name="status"),
        CheckConstraint("identity_mode IN ('none', 'external_id', 'unique_value')", name="identity_mode"),
        CheckConstraint("claim_order IN ('fifo', 'random')", name="claim_order"),
        CheckConstraint("share_weight BETWEEN 1 AND 1000", name="share_weight"),
        CheckConstraint("lane_order IN ('local_first', 'remote_first')", name="lane_order"),
    )

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[str] = mapped_column(Text, nullable=False)
    identity_mode: Mapped[str] = mapped_column(Text, nullable=False)
    claim_order: Mapped[str] = mapped_column(Text, nullable=False)
    dispatch_qps = mapped_column(Double)
    worker_claim_qps = mapped_column(Double)
    max_jobs_per_claim: Mapped[int] = mapped_column(Integer, nullable=False)
    max_resets: Mapped[int] = mapped_column(Integer, nullable=False)
    recommended_lease_seconds: Mapped[int] = mapped_column(Integer, nullable=False)
    retry_backoff_seconds: Mapped[int] = mapped_column(Integer, nullable=False)
    client_versions: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    max_in_flight = mapped_column(Integer)
    max_worker_in_flight = mapped_column(Integer)
    prefer_new_worker: Mapped[bool] = mapped_column(Boolean, nullable=False)
    max_worker_attempts = mapped_column(Integer)
    task_timeout_seconds = mapped_column(Integer)
    attempt_timeout_seconds = mapped_column(Integer)
    upload_timeout_seconds: Mapped[int] = mapped_column(Integer, nullable=False)
    fallback_after_seconds: Mapped[int] = mapped_column(Integer, nullable=False, server_default="60")
    share_weight: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    lane_order: Mapped[str] = mapped_column(Text, nullable=False, server_default="remote_first")
    policy_version: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class ProjectDispatch(Model):
    """Token-bucket state, apart from ``projects`` so that locking it never
    blocks the foreign-key checks of concurrent job writes."""

    __tablename__ = "project_dispatch"

    project_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    tokens = mapped_column(Double, nullable=False, server_default="0")
    # The epoch: a new bucket starts full.
    refilled_at = mapped_column(DateTime(timezone=True), nullable=False,
                                server_default=text("'1970-01-01 00:00:00+00'"))


class Job(Model):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_in("state", JOB_STATES), name="state"),
        CheckConstraint("type IN ('seed', 'asset')", name="type"),
        Index("ix_jobs_project_state_id", "project_id", "state", "id"),
        Index("ix_jobs_todo_fifo", "project_id", "created_at", "id",
              postgresql_where=text("state = 'todo'")),
        Index("ix_jobs_todo_random", "project_id", "random_key", "id",
              postgresql_where=text("state = 'todo'")),
        Index("ix_jobs_wip_lease", "project_id", "lease_expires_at",
              postgresql_where=text("state = 'wip'")),
        Index("ix_jobs_live_worker", "project_id", "worker_id",
              postgresql_where=text("state IN ('wip', 'staged')")),
        # Waiting jobs that were claimed before: what the sweep looks at (a
        # passed task deadline, a job tried out), never the untried backlog.
        Index("ix_jobs_todo_retries", "deadline_at",
              postgresql_where=text("state = 'todo' AND attempts_count > 0")),
        Index("uq_jobs_external_id", "project_id", "ext_id", unique=True,
              postgresql_where=text("ext_id IS NOT NULL")),
        Index("uq_jobs_value_sha256", "project_id", "value_sha256", unique=True,
              postgresql_where=text("value_sha256 IS NOT NULL")),
        Index("ix_jobs_attr", "attr", postgresql_using="gin", postgresql_ops={"attr": "jsonb_path_ops"},
              postgresql_where=text("attr IS NOT NULL")),
        Index("ix_jobs_todo_tried", "project_id", "id",
              postgresql_where=text("state = 'todo' AND attempts_count > 0")),
        Index("ix_jobs_site", "project_id", "site_key", "id",
              postgresql_where=text("site_key IS NOT NULL")),
        # A site's attempts in flight (app.sites.gate counts them per claim).
        Index("ix_jobs_live_site", "site_key", "project_id",
              postgresql_where=text("state = 'wip' AND site_key IS NOT NULL")),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    # A project's jobs are kept by triggers, not a foreign key: the check and
    # the lock of the project row run once per INSERT statement instead of
    # once per row, and deleting a project deletes its jobs (migration 0026).
    project_id: Mapped[str] = mapped_column(String(128), nullable=False)
    ext_id = mapped_column(Text)
    value_sha256 = mapped_column(LargeBinary)
    value: Mapped[str] = mapped_column(Text, nullable=False)
    type: Mapped[str] = mapped_column(Text, nullable=False)
    via = mapped_column(Text)
    hops = mapped_column(Integer)
    attr = mapped_column(JSONB)
    random_key: Mapped[int] = mapped_column(Integer, nullable=False)
    # The publisher its fetch reaches (app.sites.keys), None when it names none.
    site_key = mapped_column(Text)
    state: Mapped[str] = mapped_column(Text, nullable=False, server_default="todo")
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    not_before = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    deadline_at = mapped_column(DateTime(timezone=True))
    # What was left of the task budget when its worker went away (the budget
    # pauses while the job waits; states.first_claim_deadline).
    work_left_s = mapped_column(Double)
    current_attempt_id = mapped_column(BigInteger)
    worker_id = mapped_column(Text)
    worker_owner = mapped_column(Text)
    lease_expires_at = mapped_column(DateTime(timezone=True))
    resets: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    attempts_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    last_error = mapped_column(JSONB)


# Job search (migration 0016, app/projects/job_search.py): a value prefix
# (the first 256 characters: a btree entry must stay small whatever the
# value's length), an attribute key/value (above), error text.
Index("ix_jobs_value_prefix", Job.project_id, func.left(Job.value, 256).label("value_prefix"), Job.id,
      postgresql_ops={"value_prefix": "text_pattern_ops"})
Index("ix_jobs_error_text", Job.last_error.op("->>")("message").label("error_message"),
      postgresql_using="gin", postgresql_ops={"error_message": "gin_trgm_ops"},
      postgresql_where=text("last_error IS NOT NULL"))


class Attempt(Model):
    __tablename__ = "attempts"
    __table_args__ = (
        CheckConstraint(_in("state", ATTEMPT_STATES), name="state"),
        # Dashboard throughput and recent errors (migration 0004): bounded
        # time-range scans instead of reading the whole table per page view.
        Index("ix_attempts_project_created", "project_id", "created_at"),
        Index("ix_attempts_project_done", "project_id", "finished_at",
              postgresql_where=text("state = 'done'")),
        Index("ix_attempts_failed_finished", "finished_at",
              postgresql_where=text("state IN ('failed', 'expired')")),
        Index("uq_attempts_wire_id", "job_id", "wire_id", unique=True,
              postgresql_where=text("wire_id IS NOT NULL")),
        # What each worker did (migration 0015): its last finished attempts
        # and its counts of the last hour and day, one range scan per worker.
        # The owner is coalesced so that a node (no owner) matches by "=".
        Index("ix_attempts_worker_finished", "worker_id", text("COALESCE(worker_owner, '')"),
              "finished_at", postgresql_where=text("finished_at IS NOT NULL")),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True)
    # No foreign key: the job already pins the project, and claims insert
    # attempts in batches where a second key check per row is pure cost.
    project_id: Mapped[str] = mapped_column(String(128), nullable=False)
    worker_id: Mapped[str] = mapped_column(Text, nullable=False)
    worker_owner = mapped_column(Text)
    state: Mapped[str] = mapped_column(Text, nullable=False, server_default="running")
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    lease_expires_at = mapped_column(DateTime(timezone=True), nullable=False)
    deadline_at = mapped_column(DateTime(timezone=True))
    finished_at = mapped_column(DateTime(timezone=True))
    outcome = mapped_column(JSONB)
    error = mapped_column(JSONB)
    # The id the worker holds when it is not ``id`` (attempts imported from
    # SavewebHQ keep their ``at_…`` ids); see migration 0006.
    wire_id = mapped_column(Text)


class JobCount(Model):
    """Delta rows; the count of (project, state) is the sum of its deltas."""

    __tablename__ = "job_counts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    state: Mapped[str] = mapped_column(Text, nullable=False)
    delta: Mapped[int] = mapped_column(BigInteger, nullable=False)


class AttemptTotal(Model):
    """Monotonic delta rows: attempts that entered each state, per project."""

    __tablename__ = "attempt_totals"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    state: Mapped[str] = mapped_column(Text, nullable=False)
    delta: Mapped[int] = mapped_column(BigInteger, nullable=False)


class WorkerClaimBucket(Model):
    """Claims of one worker in one minute, for paced projects (migration 0007)."""

    __tablename__ = "worker_claim_buckets"
    __table_args__ = (
        Index("ix_worker_claim_buckets_project_time", "project_id", text("bucket_started_at DESC")),
        Index("ix_worker_claim_buckets_time", "bucket_started_at"),
    )

    project_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    bucket_started_at = mapped_column(DateTime(timezone=True), primary_key=True)
    claim_requests: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    jobs_dispatched: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    policy_version = mapped_column(BigInteger)


BULK_ACTIONS = ("requeue", "delete")
BULK_STATES = ("running", "done", "cancelled")


class BulkAction(Model):
    """An admin's requeue or delete of every job matching a filter, done in
    bounded batches in the background (migration 0016, app/projects/bulk.py)."""

    __tablename__ = "bulk_actions"
    __table_args__ = (
        CheckConstraint(_in("action", BULK_ACTIONS), name="action"),
        CheckConstraint(_in("state", BULK_STATES), name="state"),
        Index("ix_bulk_actions_project", "project_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("projects.id", ondelete="CASCADE"), nullable=False)
    action: Mapped[str] = mapped_column(Text, nullable=False)
    filter = mapped_column(JSONB, nullable=False)
    state: Mapped[str] = mapped_column(Text, nullable=False, server_default="running")
    matched: Mapped[int] = mapped_column(BigInteger, nullable=False)       # the count shown at confirmation
    # Batches walk job ids upwards; everything at or below this id is done.
    scanned_through: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # The newest job id when the admin confirmed: later jobs are not touched.
    through_job_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    processed: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    changed: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    skipped: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_error = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(Text, nullable=False)
    reason = mapped_column(Text)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    finished_at = mapped_column(DateTime(timezone=True))
