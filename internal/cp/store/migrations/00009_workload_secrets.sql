-- Workload secrets: the values operators set for instances to read (an
-- instance spec names them in spec.secrets). One global namespace (Drover
-- has no projects); name matches ^[a-z0-9][a-z0-9_.-]{0,62}$ (checked by
-- cp/secrets). value is the KEK-sealed value (internal/cp/kek, associated
-- data "workload_secret/" || name), base64: never plaintext. version starts
-- at 1 and grows by one on every replacement. Same portable conventions as
-- 00001. The older "secrets" table holds the control plane's own CA key.

-- +goose Up
CREATE TABLE workload_secrets (
    name       TEXT   NOT NULL PRIMARY KEY,
    value      TEXT   NOT NULL,
    version    BIGINT NOT NULL DEFAULT 1,
    created_by TEXT   NOT NULL DEFAULT '',
    created_at BIGINT NOT NULL DEFAULT 0,
    updated_by TEXT   NOT NULL DEFAULT '',
    updated_at BIGINT NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE workload_secrets;
