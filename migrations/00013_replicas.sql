-- +goose Up

-- The roster of live replicas: each replica writes its row at start and every few
-- seconds after (internal/replicas), and deletes it when it stops. What it counts
-- (the rows seen within the roster's TTL) is how many replicas share the buckets,
-- which decides each replica's share of the cluster bucket while Redis cannot
-- decide and admission fails open. Rows not seen within the TTL are deleted by the
-- next heartbeat of any replica: a replica that died leaves no row for long.
CREATE TABLE replicas (
    id         text PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE replicas;
