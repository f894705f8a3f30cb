-- +goose Up

-- The version (a content hash) of the template each warm slot was warmed from and
-- each sandbox runs. A slot of an older version is never handed out: the replenisher
-- retires it and warms one of the current version. Rows from before this migration
-- know no version: their slots are retired and replaced, their sandboxes report none.
ALTER TABLE pool_slots ADD COLUMN template_version text NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN template_version text NOT NULL DEFAULT '';

DROP INDEX pool_slots_ready_by_shape;
CREATE INDEX pool_slots_ready_by_shape ON pool_slots (template, cpu_millis, memory_mib, disk_gib, template_version, created_at)
    WHERE state = 'ready';

-- +goose Down
DROP INDEX pool_slots_ready_by_shape;
CREATE INDEX pool_slots_ready_by_shape ON pool_slots (template, cpu_millis, memory_mib, disk_gib, created_at)
    WHERE state = 'ready';
ALTER TABLE sandboxes DROP COLUMN template_version;
ALTER TABLE pool_slots DROP COLUMN template_version;
