-- +goose Up

-- Idempotency keys (internal/idempotency, draft-ietf-httpapi-idempotency-key-header):
-- a client's key names one request until expires_at, and can name another after
-- that. They lived on operations (a unique index that never expired, for queued
-- requests only); they get a table of their own so that a synchronous create can
-- hold one too and an expired key can be claimed again.
CREATE TABLE idempotency_keys (
    -- The authenticated client id: keys are per client.
    client       text NOT NULL,
    key          text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    -- Hash of the request the key names (idempotency.Hash).
    request_hash text NOT NULL,
    -- What the request made: its queued operation, or for a synchronous create only
    -- its sandbox (no foreign keys: a refused create leaves no sandbox row, and its
    -- retry under the key creates it).
    operation_id uuid,
    sandbox_id   uuid,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (client, key)
);

CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

-- Keys already given keep naming their operation for a day from when it was queued,
-- the default time-to-live.
INSERT INTO idempotency_keys (client, key, request_hash, operation_id, sandbox_id, created_at, expires_at)
    SELECT client, idempotency_key, request_hash, id, sandbox_id, created_at, created_at + interval '24 hours'
    FROM operations WHERE idempotency_key IS NOT NULL;

-- operations.idempotency_key stays, as the record of which key queued the operation;
-- it is no longer unique, since a key may be used again once it expires.
DROP INDEX operations_idempotency;

-- +goose Down
-- Back to one operation per key for ever: operations that reused an expired key keep
-- their id but lose the key, so that the unique index can be made again.
UPDATE operations o SET idempotency_key = NULL
    WHERE idempotency_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM operations p WHERE p.client = o.client AND p.idempotency_key = o.idempotency_key
            AND (p.created_at, p.id) < (o.created_at, o.id));
CREATE UNIQUE INDEX operations_idempotency ON operations (client, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
DROP TABLE idempotency_keys;
