-- +goose NO TRANSACTION
-- +goose Up

-- Retention (docs/operations.md, "Retention"): ended sandboxes and finished operations
-- are deleted in small batches some time after they ended. Each index holds only the
-- rows retention may delete, oldest first, so that the batch is found without reading
-- the live rows. Built without blocking writes; an invalid index a cut build left is
-- built again.
DROP INDEX CONCURRENTLY IF EXISTS sandboxes_ended;
CREATE INDEX CONCURRENTLY sandboxes_ended ON sandboxes (updated_at) WHERE state IN ('terminated', 'failed');
DROP INDEX CONCURRENTLY IF EXISTS operations_finished;
CREATE INDEX CONCURRENTLY operations_finished ON operations (finished_at) WHERE state IN ('succeeded', 'failed');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS operations_finished;
DROP INDEX CONCURRENTLY IF EXISTS sandboxes_ended;
