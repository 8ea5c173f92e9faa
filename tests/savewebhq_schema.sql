-- A SavewebHQ tracker database as its seven migrations leave it: the tables,
-- columns, defaults and constraints the FleetHQ import reads, written out as
-- one final schema. Times are Unix seconds (bigint); token_hash is
-- SHA-256("saveweb-machine-token-v1" NUL token).

CREATE TABLE tracker_schema_migrations (
    version bigint PRIMARY KEY,
    applied_at bigint NOT NULL
);
INSERT INTO tracker_schema_migrations (version, applied_at)
SELECT v, 1700000000 FROM generate_series(1, 7) AS v;

CREATE TABLE tracker_users (
    id text PRIMARY KEY,
    status text NOT NULL CHECK (status IN ('pending', 'active', 'suspended')),
    roles text[] NOT NULL DEFAULT '{}',
    github_user_id bigint,
    github_login text,
    github_avatar_url text,
    last_login_at bigint,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL
);
CREATE UNIQUE INDEX ON tracker_users (github_user_id) WHERE github_user_id IS NOT NULL;

CREATE TABLE tracker_machine_tokens (
    user_id text PRIMARY KEY REFERENCES tracker_users (id) ON DELETE CASCADE,
    token_hash bytea NOT NULL UNIQUE,
    token text,                       -- NULL for tokens stored before tokens were viewable
    created_at bigint NOT NULL,
    revoked_at bigint
);

CREATE TABLE tracker_web_sessions (
    token_hash bytea PRIMARY KEY,
    user_id text NOT NULL REFERENCES tracker_users (id) ON DELETE CASCADE,
    created_at bigint NOT NULL,
    expires_at bigint NOT NULL
);

CREATE TABLE tracker_projects (
    id text PRIMARY KEY,
    status text NOT NULL CHECK (status IN ('active', 'draining', 'archived')),
    identity_mode text NOT NULL DEFAULT 'external_id'
        CHECK (identity_mode IN ('none', 'external_id', 'unique_value')),
    claim_order text NOT NULL DEFAULT 'fifo' CHECK (claim_order IN ('fifo', 'random')),
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    dispatch_qps double precision
        CHECK (dispatch_qps IS NULL OR (dispatch_qps > 0 AND dispatch_qps < 'Infinity')),
    worker_claim_qps double precision
        CHECK (worker_claim_qps IS NULL OR (worker_claim_qps > 0 AND worker_claim_qps < 'Infinity')),
    max_jobs_per_claim integer NOT NULL DEFAULT 256 CHECK (max_jobs_per_claim BETWEEN 1 AND 256),
    policy_version bigint NOT NULL DEFAULT 1 CHECK (policy_version > 0),
    dispatch_tokens double precision,
    dispatch_refilled_at_ns bigint,
    client_versions text[] NOT NULL DEFAULT '{}',
    max_resets integer NOT NULL DEFAULT 3 CHECK (max_resets BETWEEN 0 AND 1000),
    recommended_lease_seconds bigint NOT NULL DEFAULT 300
        CHECK (recommended_lease_seconds BETWEEN 1 AND 3600)
);

CREATE TABLE tracker_worker_claim_buckets (
    project_id text NOT NULL REFERENCES tracker_projects (id) ON DELETE CASCADE,
    worker_id text NOT NULL,
    bucket_started_at_ms bigint NOT NULL,
    claim_requests bigint NOT NULL DEFAULT 0 CHECK (claim_requests >= 0),
    jobs_dispatched bigint NOT NULL DEFAULT 0 CHECK (jobs_dispatched >= 0),
    policy_version bigint NOT NULL,
    PRIMARY KEY (project_id, worker_id, bucket_started_at_ms)
);

-- spec holds {type, via, hops, attr}, each omitted when empty; status 'wip'
-- is the only state with an attempt, a worker and a lease.
CREATE TABLE tracker_jobs (
    job_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id text NOT NULL REFERENCES tracker_projects (id) ON DELETE CASCADE,
    external_id text,
    value text NOT NULL,
    unique_value_digest bytea,        -- SHA-256 of value, unique_value projects only
    random_key integer NOT NULL,
    spec jsonb NOT NULL DEFAULT '{}',
    status text NOT NULL CHECK (status IN ('todo', 'wip', 'done', 'failed', 'reset_exhausted')),
    attempt_id text,
    worker_id text,
    lease_expires_at bigint,
    reset_count integer NOT NULL DEFAULT 0 CHECK (reset_count >= 0),
    outcome jsonb,
    artifact_receipts jsonb,
    execution_error jsonb,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    completed_at bigint,
    CHECK (external_id IS NULL OR unique_value_digest IS NULL),
    CHECK ((status = 'wip' AND attempt_id IS NOT NULL AND worker_id IS NOT NULL
            AND lease_expires_at IS NOT NULL)
        OR (status <> 'wip' AND attempt_id IS NULL AND worker_id IS NULL
            AND lease_expires_at IS NULL))
);
CREATE UNIQUE INDEX ON tracker_jobs (project_id, external_id) WHERE external_id IS NOT NULL;
CREATE UNIQUE INDEX ON tracker_jobs (project_id, unique_value_digest)
    WHERE unique_value_digest IS NOT NULL;
CREATE INDEX ON tracker_jobs (project_id, created_at, job_id) WHERE status = 'todo';
CREATE INDEX ON tracker_jobs (project_id, random_key, job_id) WHERE status = 'todo';
CREATE INDEX ON tracker_jobs (project_id, lease_expires_at) WHERE status = 'wip';

CREATE TABLE tracker_workers (
    worker_id text PRIMARY KEY,
    user_id text NOT NULL REFERENCES tracker_users (id) ON DELETE CASCADE
);
CREATE INDEX ON tracker_workers (user_id);
