-- +goose Up

-- API keys (SPACE_AUTH_MODE=api_key). Only a SHA-256 of each key is stored: a key is
-- 256 random bits, so its hash cannot be reversed or guessed, and a leak of this table
-- does not leak usable keys. client is the client id the key speaks for; it is still
-- mapped through the allowlist on every request.
CREATE TABLE api_keys (
    id           uuid PRIMARY KEY,
    client       text NOT NULL,
    name         text NOT NULL,
    hash         bytea NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);

CREATE INDEX api_keys_by_client ON api_keys (client);

-- +goose Down
DROP TABLE api_keys;
