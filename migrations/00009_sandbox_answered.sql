-- +goose NO TRANSACTION
-- +goose Up

-- Whether a client was ever told of the sandbox: a synchronous create's 201 (or the
-- retry under its Idempotency-Key that returned it), or a queued create's 202, which
-- names the sandbox id before it exists. A synchronous create that was never answered
-- and has no key to be retried under can be claimed by nobody, so the reconciler ends
-- it failed and stops what runs for it (docs/design.md, "Unanswered creates"). Rows
-- written before this column existed were answered as far as anyone can tell.
-- A constant default: the column is added without writing a row, the table's lock held
-- for an instant.
ALTER TABLE sandboxes ADD COLUMN IF NOT EXISTS answered boolean NOT NULL DEFAULT true;

-- The unanswered rows, for the reconciler: few at any time, whatever the history.
-- Built without blocking writes (each migration step on its own, outside a
-- transaction); an invalid index a cut build left is built again.
DROP INDEX CONCURRENTLY IF EXISTS sandboxes_unanswered;
CREATE INDEX CONCURRENTLY sandboxes_unanswered ON sandboxes (updated_at) WHERE NOT answered;

-- A sandbox's live key, for the reconciler to tell a keyed create (kept for its
-- retry) from an unkeyed one.
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_sandbox;
CREATE INDEX CONCURRENTLY idempotency_keys_sandbox ON idempotency_keys (sandbox_id) WHERE sandbox_id IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_sandbox;
DROP INDEX CONCURRENTLY IF EXISTS sandboxes_unanswered;
ALTER TABLE sandboxes DROP COLUMN IF EXISTS answered;
