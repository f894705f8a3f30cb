-- +goose Up

-- Fair queueing between owners (docs/dispatcher.md, "Fair between owners"). Each owner
-- has a few lanes in the River queue, as many as its weight: an operation in a lane
-- has a job the queue may run; the others of the owner wait parked (their job
-- scheduled far ahead) and are moved into a lane, oldest first, as the owner's
-- operations end. One owner's backlog so never stands in front of another owner's
-- work, and never churns through the queue while its bucket is empty.
ALTER TABLE operations ADD COLUMN parked boolean NOT NULL DEFAULT false;
-- The budget key and tier the operation was accepted under: the queue's series are
-- labelled by them (bounded), never by the owner.
ALTER TABLE operations ADD COLUMN budget_key text NOT NULL DEFAULT 'unknown';
ALTER TABLE operations ADD COLUMN tier text NOT NULL DEFAULT '';

-- An owner's parked operations, oldest first, and its operations in a lane.
CREATE INDEX operations_parked ON operations (client, created_at, id) WHERE parked AND state = 'queued';
CREATE INDEX operations_in_lane ON operations (client) WHERE NOT parked AND state IN ('queued', 'running');

-- +goose Down
DROP INDEX operations_in_lane;
DROP INDEX operations_parked;
ALTER TABLE operations DROP COLUMN tier;
ALTER TABLE operations DROP COLUMN budget_key;
ALTER TABLE operations DROP COLUMN parked;
