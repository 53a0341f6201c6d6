-- Allocations (a user bound to a host or to an instance) and browser
-- terminal sessions (seed 002). Same portable conventions as 00001.
-- Terminal tokens are stored only as their SHA-256 (token_hash, unique);
-- token_used_at is set once, when the token is redeemed, which is what makes
-- a token single use across replicas. terminal_sessions.state is the last
-- readiness hop of seed 002 (internal/wire/terminal.States). No foreign keys, as
-- for instances.host_id: allocations are never deleted, and the store maps
-- only unique violations to ErrConflict.

-- +goose Up
CREATE TABLE allocations (
    id                TEXT   NOT NULL PRIMARY KEY,
    username          TEXT   NOT NULL,
    host_id           TEXT   NOT NULL,
    instance_id       TEXT   NOT NULL DEFAULT '',
    state             TEXT   NOT NULL CHECK (state IN ('provisioning', 'active', 'failed', 'releasing', 'released')),
    state_reason      TEXT   NOT NULL DEFAULT '',
    spec              TEXT   NOT NULL DEFAULT '',
    provision_task_id TEXT   NOT NULL DEFAULT '',
    release_task_id   TEXT   NOT NULL DEFAULT '',
    created_by        TEXT   NOT NULL DEFAULT '',
    created_at        BIGINT NOT NULL DEFAULT 0,
    updated_at        BIGINT NOT NULL DEFAULT 0
);

CREATE INDEX allocations_host ON allocations (host_id, created_at, id);
CREATE INDEX allocations_instance ON allocations (instance_id, created_at, id);
CREATE INDEX allocations_created ON allocations (created_at, id);

CREATE TABLE terminal_sessions (
    id               TEXT    NOT NULL PRIMARY KEY,
    allocation_id    TEXT    NOT NULL,
    node_id          TEXT    NOT NULL DEFAULT '',
    username         TEXT    NOT NULL DEFAULT '',
    mode             TEXT    NOT NULL CHECK (mode IN ('pty', 'serial')),
    instance_id      TEXT    NOT NULL DEFAULT '',
    token_hash       TEXT    NOT NULL UNIQUE,
    token_expires_at BIGINT  NOT NULL DEFAULT 0,
    token_used_at    BIGINT  NOT NULL DEFAULT 0,
    state            TEXT    NOT NULL CHECK (state IN ('token_ready', 'browser_ws_ready', 'terminal_open_sent',
                                                       'node_stream_connected', 'pty_ready', 'failed')),
    states           TEXT    NOT NULL DEFAULT '',
    error_code       TEXT    NOT NULL DEFAULT '',
    error_message    TEXT    NOT NULL DEFAULT '',
    task_id          TEXT    NOT NULL DEFAULT '',
    correlation_id   TEXT    NOT NULL DEFAULT '',
    cols             INTEGER NOT NULL DEFAULT 0,
    term_rows        INTEGER NOT NULL DEFAULT 0,
    created_by       TEXT    NOT NULL DEFAULT '',
    created_at       BIGINT  NOT NULL DEFAULT 0,
    closed_at        BIGINT  NOT NULL DEFAULT 0,
    exit_code        INTEGER NOT NULL DEFAULT 0,
    exited           INTEGER NOT NULL DEFAULT 0 CHECK (exited IN (0, 1)),
    close_reason     TEXT    NOT NULL DEFAULT '',
    recording_path   TEXT    NOT NULL DEFAULT '',
    recording_bytes  BIGINT  NOT NULL DEFAULT 0
);

CREATE INDEX terminal_sessions_allocation ON terminal_sessions (allocation_id, created_at, id);
CREATE INDEX terminal_sessions_node ON terminal_sessions (node_id, created_at, id);
CREATE INDEX terminal_sessions_created ON terminal_sessions (created_at, id);

-- +goose Down
DROP TABLE terminal_sessions;
DROP TABLE allocations;
