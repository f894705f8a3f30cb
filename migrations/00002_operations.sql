-- +goose Up

-- Queued operations (docs/dispatcher.md). Each row is inserted in the same transaction as
-- its River job, so an accepted operation always has a job and a job always has its
-- row. The row is what clients see (GET /v1/operations/{id}); River's job row is the
-- queue's own bookkeeping.
CREATE TABLE operations (
    id                 uuid PRIMARY KEY,
    kind               text NOT NULL CHECK (kind IN ('create', 'restore', 'wake')),
    -- The key the operation runs and is charged as: the caller's bounded client key,
    -- or the sandbox owner's for a wake.
    client             text NOT NULL,
    -- Fixed at enqueue, for a create too (no foreign key: the sandbox row of a create
    -- is made by the worker, and a retry reuses it).
    sandbox_id         uuid NOT NULL,
    state              text NOT NULL DEFAULT 'queued'
                         CHECK (state IN ('queued', 'running', 'succeeded', 'failed')),
    -- Real attempts only; admission snoozes are counted apart.
    attempts           integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    snoozes            integer NOT NULL DEFAULT 0 CHECK (snoozes >= 0),
    -- The limit that turned the operation away last (a space.Bucket), if any.
    last_bucket        text,
    last_error         text,
    -- Why a failed operation failed: admission_timeout or a domain error code.
    error_code         text,
    -- The client's Idempotency-Key, unique per client; request_hash tells a repeat of
    -- the same request from a different request reusing the key.
    idempotency_key    text CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    request_hash       text NOT NULL,
    -- The validated request: the create body; {} for a restore or a wake.
    request            jsonb NOT NULL DEFAULT '{}',
    admission_deadline timestamptz NOT NULL,
    -- River's job id, for operators following an operation into river_job.
    job_id             bigint,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    -- First time a worker picked it up (queue latency), and when it became final.
    started_at         timestamptz,
    finished_at        timestamptz
);

CREATE UNIQUE INDEX operations_idempotency ON operations (client, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE INDEX operations_by_sandbox ON operations (sandbox_id);

-- +goose Down
DROP TABLE operations;
