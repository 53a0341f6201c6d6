-- Dashboard sessions, in the store so that any replica serves a browser
-- that logged in on another (no sticky load balancer) and a logout ends
-- the session on every replica. id_hash is the SHA-256 of the session
-- cookie (hex): the cookie itself is never stored. token is the
-- operator token the session acts with, sealed with the key-encryption
-- key (internal/cp/kek, associated data "dashboard_session/" || id_hash),
-- base64: never plaintext. A replica without a KEK keeps its sessions in
-- memory and never writes here.

-- +goose Up
CREATE TABLE dashboard_sessions (
    id_hash    TEXT   NOT NULL PRIMARY KEY,
    token      TEXT   NOT NULL,
    csrf       TEXT   NOT NULL,
    created_at BIGINT NOT NULL DEFAULT 0,
    expires_at BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX dashboard_sessions_expires ON dashboard_sessions (expires_at);

-- +goose Down
DROP TABLE dashboard_sessions;
