-- +goose NO TRANSACTION
-- +goose Up

-- The operations not yet final, for the queue's signals read at every scrape
-- (space_dispatcher_queue_depth, space_dispatcher_oldest_queued_seconds): a small
-- index however long the history of finished operations grows.
-- Built without blocking writes; an invalid index a cut build left is built again.
DROP INDEX CONCURRENTLY IF EXISTS operations_unfinished;
CREATE INDEX CONCURRENTLY operations_unfinished ON operations (kind, state, created_at)
    WHERE state IN ('queued', 'running');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS operations_unfinished;
