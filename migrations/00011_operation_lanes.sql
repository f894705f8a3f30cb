-- +goose NO TRANSACTION
-- +goose Up

-- Fair queueing between owners (docs/dispatcher.md, "Fair between owners"). Each owner
-- has a few lanes in the River queue, as many as its weight: an operation in a lane
-- has a job the queue may run; the others of the owner wait parked (their job
-- scheduled far ahead) and are moved into a lane, oldest first, as the owner's
-- operations end. One owner's backlog so never stands in front of another owner's
-- work, and never churns through the queue while its bucket is empty.
-- Constant defaults: the columns are added without writing a row, in one ALTER that
-- holds the table's lock for an instant.
--
-- The budget key and tier the operation was accepted under: the queue's series are
-- labelled by them (bounded), never by the owner.
ALTER TABLE operations
    ADD COLUMN IF NOT EXISTS parked boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS budget_key text NOT NULL DEFAULT 'unknown',
    ADD COLUMN IF NOT EXISTS tier text NOT NULL DEFAULT '';

-- An owner's parked operations, oldest first, and its operations in a lane: built
-- without blocking writes; an invalid index a cut build left is built again.
DROP INDEX CONCURRENTLY IF EXISTS operations_parked;
CREATE INDEX CONCURRENTLY operations_parked ON operations (client, created_at, id) WHERE parked AND state = 'queued';
DROP INDEX CONCURRENTLY IF EXISTS operations_in_lane;
CREATE INDEX CONCURRENTLY operations_in_lane ON operations (client) WHERE NOT parked AND state IN ('queued', 'running');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS operations_in_lane;
DROP INDEX CONCURRENTLY IF EXISTS operations_parked;
ALTER TABLE operations DROP COLUMN IF EXISTS tier, DROP COLUMN IF EXISTS budget_key, DROP COLUMN IF EXISTS parked;
