-- +goose Up

-- One row per sandbox. client is the owner's bounded client key (an allowlisted id or
-- 'unknown'), never a raw header value.
CREATE TABLE sandboxes (
    id            uuid PRIMARY KEY,
    client        text NOT NULL,
    state         text NOT NULL CHECK (state IN
                    ('starting', 'running', 'pausing', 'paused', 'restoring', 'failed', 'terminated')),
    template      text NOT NULL,
    cpu_millis    integer NOT NULL CHECK (cpu_millis > 0),
    memory_mib    integer NOT NULL CHECK (memory_mib > 0),
    disk_gib      integer NOT NULL CHECK (disk_gib > 0),
    warm          boolean NOT NULL DEFAULT false,
    metadata      jsonb NOT NULL DEFAULT '{}',
    substrate_ref text,
    snapshot_ref  text,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- The live-sandbox cap counts a client's live sandboxes on every create and restore.
CREATE INDEX sandboxes_live_by_client ON sandboxes (client)
    WHERE state IN ('starting', 'running', 'pausing', 'restoring');

-- A client lists its own sandboxes, newest first, with keyset pagination.
CREATE INDEX sandboxes_by_client_created ON sandboxes (client, created_at DESC, id DESC);

-- Warm pool slots, keyed by the whole shape.
CREATE TABLE pool_slots (
    id            uuid PRIMARY KEY,
    template      text NOT NULL,
    cpu_millis    integer NOT NULL,
    memory_mib    integer NOT NULL,
    disk_gib      integer NOT NULL,
    state         text NOT NULL CHECK (state IN ('warming', 'ready', 'claimed')),
    substrate_ref text,
    sandbox_id    uuid REFERENCES sandboxes (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Claims look for the oldest ready slot of one exact shape.
CREATE INDEX pool_slots_ready_by_shape ON pool_slots (template, cpu_millis, memory_mib, disk_gib, created_at)
    WHERE state = 'ready';

-- +goose Down
DROP TABLE pool_slots;
DROP TABLE sandboxes;
