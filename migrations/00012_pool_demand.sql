-- +goose Up

-- The warm pool's demand: the claims (hits and misses alike) of each shape, one row per
-- shape and second. Every replica counts its claims in memory and adds them here about
-- once a second, so that a claim costs no write of its own, and the replenisher (one
-- replica at a time) sizes each pool from the claims of every replica. Rows older than
-- the replenisher's longest window are deleted by it.
CREATE TABLE pool_demand (
    at         timestamptz NOT NULL,
    template   text NOT NULL,
    cpu_millis integer NOT NULL,
    memory_mib integer NOT NULL,
    disk_gib   integer NOT NULL,
    claims     bigint NOT NULL CHECK (claims >= 0),
    PRIMARY KEY (at, template, cpu_millis, memory_mib, disk_gib)
);

-- The targets the replenisher computed from that demand, one row per shape: every
-- replica reports them at scrape time, and a replica that takes over replenishing
-- keeps the target until the cooldown since peak_at (the last time demand asked for
-- all of it) has passed, instead of starting again from the bottom.
CREATE TABLE pool_targets (
    template       text NOT NULL,
    cpu_millis     integer NOT NULL,
    memory_mib     integer NOT NULL,
    disk_gib       integer NOT NULL,
    target         integer NOT NULL CHECK (target >= 0),
    -- The slots the demand keeps in flight: claim rate × warm-up time.
    demand_slots   double precision NOT NULL,
    warmup_seconds double precision NOT NULL,
    peak_at        timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    PRIMARY KEY (template, cpu_millis, memory_mib, disk_gib)
);

-- +goose Down
DROP TABLE pool_targets;
DROP TABLE pool_demand;
