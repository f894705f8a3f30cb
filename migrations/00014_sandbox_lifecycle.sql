-- +goose NO TRANSACTION
-- +goose Up

-- The lifecycle (docs/lifecycle.md): when a sandbox's max lifetime ends it
-- (expires_at), when its idle action is due while it runs (idle_at, and which action
-- that is), when its retention deletes it while it is paused (retain_until), and why
-- it was paused or ended. Each is fixed when the sandbox is created, becomes active or
-- is paused, from its client's lifecycle then; NULL bounds nothing. Nullable columns
-- without a default: adding them writes no row and holds the table's lock for an
-- instant, whatever its size.
ALTER TABLE sandboxes
    ADD COLUMN IF NOT EXISTS expires_at timestamptz,
    ADD COLUMN IF NOT EXISTS idle_at timestamptz,
    ADD COLUMN IF NOT EXISTS idle_action text,
    ADD COLUMN IF NOT EXISTS retain_until timestamptz,
    ADD COLUMN IF NOT EXISTS pause_reason text,
    ADD COLUMN IF NOT EXISTS termination_reason text;

-- What the lifecycle looks for every round: the sandboxes whose next action is due,
-- earliest first. One index over the one expression the round's query orders by, on
-- the running and paused rows only, built without blocking writes (an invalid index
-- a cut build left is built again).
DROP INDEX CONCURRENTLY IF EXISTS sandboxes_lifecycle_due;
CREATE INDEX CONCURRENTLY sandboxes_lifecycle_due ON sandboxes ((
    CASE WHEN state = 'running' THEN least(expires_at, idle_at) ELSE least(expires_at, retain_until) END
)) WHERE state IN ('running', 'paused');

-- A budget key's paused sandboxes, which its cap of paused sandboxes counts (under the
-- key's lock) before each pause.
DROP INDEX CONCURRENTLY IF EXISTS sandboxes_paused_by_budget_key;
CREATE INDEX CONCURRENTLY sandboxes_paused_by_budget_key ON sandboxes (budget_key)
    WHERE state IN ('pausing', 'paused');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS sandboxes_paused_by_budget_key;
DROP INDEX CONCURRENTLY IF EXISTS sandboxes_lifecycle_due;
ALTER TABLE sandboxes
    DROP COLUMN IF EXISTS termination_reason,
    DROP COLUMN IF EXISTS pause_reason,
    DROP COLUMN IF EXISTS retain_until,
    DROP COLUMN IF EXISTS idle_action,
    DROP COLUMN IF EXISTS idle_at,
    DROP COLUMN IF EXISTS expires_at;
