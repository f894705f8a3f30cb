-- +goose Up

-- Ownership and budget are two things (docs/security.md, "Owners and budget keys").
-- sandboxes.client and operations.client now hold the authenticated client id that
-- owns the row, which every read and change checks; the budget key (the client id when
-- allowlisted, 'unknown' otherwise) is recorded apart, for the live-sandbox cap.
--
-- Rows written before this migration stored the budget key in client. For an
-- allowlisted client the two were the same, so its rows keep their owner. Rows stored
-- as 'unknown' do not say who made them; they keep 'unknown' as their owner, which no
-- caller can authenticate as (it is not a valid client id), so no caller can read,
-- change or replay them any more: the leak between callers off the allowlist is closed
-- rather than guessed at. They still count against the 'unknown' live cap while live,
-- and the internal wake still works for them.
ALTER TABLE sandboxes ADD COLUMN budget_key text;
UPDATE sandboxes SET budget_key = client;
ALTER TABLE sandboxes ALTER COLUMN budget_key SET NOT NULL;

DROP INDEX sandboxes_live_by_client;
CREATE INDEX sandboxes_live_by_budget_key ON sandboxes (budget_key)
    WHERE state IN ('starting', 'running', 'pausing', 'restoring');

COMMENT ON COLUMN sandboxes.client IS 'the authenticated client id that owns the sandbox';
COMMENT ON COLUMN sandboxes.budget_key IS 'the budget key of the last activation: the live cap counts live rows by it';
COMMENT ON COLUMN operations.client IS 'the authenticated client id that owns the operation and that it runs as';

-- +goose Down
DROP INDEX sandboxes_live_by_budget_key;
CREATE INDEX sandboxes_live_by_client ON sandboxes (client)
    WHERE state IN ('starting', 'running', 'pausing', 'restoring');
ALTER TABLE sandboxes DROP COLUMN budget_key;
