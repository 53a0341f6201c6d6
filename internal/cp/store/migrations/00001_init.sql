-- Drover schema, version 1.
--
-- One portable DDL for SQLite and PostgreSQL:
--   * ids are TEXT;
--   * timestamps are BIGINT unix milliseconds UTC, 0 meaning unset;
--   * booleans are INTEGER 0/1;
--   * JSON documents are TEXT, '' meaning absent;
--   * byte strings (secret values, private keys) are base64 (std) TEXT;
--   * no column is NULL, so scanning never needs sql.Null*.
-- audit.id is not database-generated (SQLite's INTEGER PRIMARY KEY and
-- PostgreSQL's BIGSERIAL/IDENTITY are not portable): sqlstore assigns it in
-- Go from a per-process strictly increasing unix-nanosecond clock and retries
-- on the (unlikely) collision with another replica.

-- +goose Up
CREATE TABLE hosts (
    id               TEXT    NOT NULL PRIMARY KEY,
    os_family        TEXT    NOT NULL DEFAULT '',
    labels           TEXT    NOT NULL DEFAULT '',
    enabled          INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    revoked          INTEGER NOT NULL DEFAULT 0 CHECK (revoked IN (0, 1)),
    status           TEXT    NOT NULL DEFAULT 'unknown',
    status_reason    TEXT    NOT NULL DEFAULT '',
    hostname         TEXT    NOT NULL DEFAULT '',
    selected_accel   TEXT    NOT NULL DEFAULT '',
    agent_version    TEXT    NOT NULL DEFAULT '',
    capabilities     TEXT    NOT NULL DEFAULT '',
    capacity         TEXT    NOT NULL DEFAULT '',
    token_hash       TEXT    NOT NULL DEFAULT '',
    token_expires_at BIGINT  NOT NULL DEFAULT 0,
    token_used       INTEGER NOT NULL DEFAULT 0 CHECK (token_used IN (0, 1)),
    cert_serial      TEXT    NOT NULL DEFAULT '',
    cert_not_after   BIGINT  NOT NULL DEFAULT 0,
    enrolled_at      BIGINT  NOT NULL DEFAULT 0,
    last_seen_at     BIGINT  NOT NULL DEFAULT 0,
    created_at       BIGINT  NOT NULL DEFAULT 0,
    updated_at       BIGINT  NOT NULL DEFAULT 0
);

CREATE INDEX hosts_status_last_seen ON hosts (status, last_seen_at);

CREATE TABLE tasks (
    id               TEXT    NOT NULL PRIMARY KEY,
    node_id          TEXT    NOT NULL,
    type             TEXT    NOT NULL,
    params           TEXT    NOT NULL DEFAULT '',
    state            TEXT    NOT NULL CHECK (state IN ('queued', 'dispatched', 'running', 'succeeded', 'failed', 'expired', 'canceled')),
    correlation_id   TEXT    NOT NULL DEFAULT '',
    created_by       TEXT    NOT NULL DEFAULT '',
    attempts         INTEGER NOT NULL DEFAULT 0,
    created_at       BIGINT  NOT NULL,
    expires_at       BIGINT  NOT NULL,
    dispatched_at    BIGINT  NOT NULL DEFAULT 0,
    lease_expires_at BIGINT  NOT NULL DEFAULT 0,
    finished_at      BIGINT  NOT NULL DEFAULT 0,
    result           TEXT    NOT NULL DEFAULT '',
    result_hash      TEXT    NOT NULL DEFAULT ''
);

CREATE INDEX tasks_node_state_created ON tasks (node_id, state, created_at);
CREATE INDEX tasks_state_lease ON tasks (state, lease_expires_at);
CREATE INDEX tasks_state_expires ON tasks (state, expires_at);
CREATE INDEX tasks_created ON tasks (created_at, id);
CREATE INDEX tasks_node_created ON tasks (node_id, created_at, id);

CREATE TABLE task_events (
    task_id TEXT   NOT NULL REFERENCES tasks (id),
    seq     BIGINT NOT NULL,
    at      BIGINT NOT NULL,
    event   TEXT   NOT NULL,
    PRIMARY KEY (task_id, seq)
);

CREATE TABLE operator_tokens (
    id         TEXT    NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL DEFAULT '',
    token_hash TEXT    NOT NULL UNIQUE,
    created_at BIGINT  NOT NULL DEFAULT 0,
    expires_at BIGINT  NOT NULL DEFAULT 0,
    revoked    INTEGER NOT NULL DEFAULT 0 CHECK (revoked IN (0, 1))
);

CREATE TABLE audit (
    id             BIGINT NOT NULL PRIMARY KEY,
    at             BIGINT NOT NULL,
    actor          TEXT   NOT NULL DEFAULT '',
    action         TEXT   NOT NULL DEFAULT '',
    target         TEXT   NOT NULL DEFAULT '',
    result         TEXT   NOT NULL DEFAULT '',
    correlation_id TEXT   NOT NULL DEFAULT '',
    detail         TEXT   NOT NULL DEFAULT ''
);

CREATE INDEX audit_at ON audit (at, id);
CREATE INDEX audit_target_at ON audit (target, at, id);
CREATE INDEX audit_correlation_at ON audit (correlation_id, at, id);

CREATE TABLE secrets (
    name       TEXT   NOT NULL PRIMARY KEY,
    value      TEXT   NOT NULL,
    created_at BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE signing_keys (
    kid         TEXT   NOT NULL PRIMARY KEY,
    private_key TEXT   NOT NULL,
    created_at  BIGINT NOT NULL DEFAULT 0,
    retired_at  BIGINT NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE signing_keys;
DROP TABLE secrets;
DROP TABLE audit;
DROP TABLE operator_tokens;
DROP TABLE task_events;
DROP TABLE tasks;
DROP TABLE hosts;
