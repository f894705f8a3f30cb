-- +goose Up

-- When the sandbox's running activation was admitted over its client's soft limit: a
-- signal to the substrate (the Kubernetes one labels the pod, and may start it at a
-- lower priority) that this is what to degrade first, and shown on the sandbox as
-- soft_breach. NULL: its activation was within the soft limit, or it has none. Each
-- activation sets or clears it.
ALTER TABLE sandboxes ADD COLUMN soft_breach_at timestamptz;

-- +goose Down
ALTER TABLE sandboxes DROP COLUMN soft_breach_at;
