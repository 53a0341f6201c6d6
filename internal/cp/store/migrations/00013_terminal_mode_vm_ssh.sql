-- Terminal sessions into slice VMs: mode 'vm_ssh' (the node brokers SSH
-- into the allocation's own VM). A CHECK constraint cannot be altered
-- portably, so the table is rebuilt with the same columns (00004 and
-- 00006) and indexes. Same portable conventions as 00001.

-- +goose Up
CREATE TABLE terminal_sessions_v2 (
    id                 TEXT    NOT NULL PRIMARY KEY,
    allocation_id      TEXT    NOT NULL,
    node_id            TEXT    NOT NULL DEFAULT '',
    username           TEXT    NOT NULL DEFAULT '',
    mode               TEXT    NOT NULL CHECK (mode IN ('pty', 'serial', 'vm_ssh')),
    instance_id        TEXT    NOT NULL DEFAULT '',
    token_hash         TEXT    NOT NULL UNIQUE,
    token_expires_at   BIGINT  NOT NULL DEFAULT 0,
    token_used_at      BIGINT  NOT NULL DEFAULT 0,
    state              TEXT    NOT NULL CHECK (state IN ('token_ready', 'browser_ws_ready', 'terminal_open_sent',
                                                         'node_stream_connected', 'pty_ready', 'failed')),
    states             TEXT    NOT NULL DEFAULT '',
    error_code         TEXT    NOT NULL DEFAULT '',
    error_message      TEXT    NOT NULL DEFAULT '',
    task_id            TEXT    NOT NULL DEFAULT '',
    correlation_id     TEXT    NOT NULL DEFAULT '',
    cols               INTEGER NOT NULL DEFAULT 0,
    term_rows          INTEGER NOT NULL DEFAULT 0,
    created_by         TEXT    NOT NULL DEFAULT '',
    created_at         BIGINT  NOT NULL DEFAULT 0,
    closed_at          BIGINT  NOT NULL DEFAULT 0,
    exit_code          INTEGER NOT NULL DEFAULT 0,
    exited             INTEGER NOT NULL DEFAULT 0 CHECK (exited IN (0, 1)),
    close_reason       TEXT    NOT NULL DEFAULT '',
    recording_path     TEXT    NOT NULL DEFAULT '',
    recording_bytes    BIGINT  NOT NULL DEFAULT 0,
    minted_by_token_id TEXT    NOT NULL DEFAULT ''
);
INSERT INTO terminal_sessions_v2 (id, allocation_id, node_id, username, mode, instance_id, token_hash, token_expires_at,
    token_used_at, state, states, error_code, error_message, task_id, correlation_id, cols, term_rows, created_by,
    created_at, closed_at, exit_code, exited, close_reason, recording_path, recording_bytes, minted_by_token_id)
SELECT id, allocation_id, node_id, username, mode, instance_id, token_hash, token_expires_at,
    token_used_at, state, states, error_code, error_message, task_id, correlation_id, cols, term_rows, created_by,
    created_at, closed_at, exit_code, exited, close_reason, recording_path, recording_bytes, minted_by_token_id
FROM terminal_sessions;
DROP TABLE terminal_sessions;
ALTER TABLE terminal_sessions_v2 RENAME TO terminal_sessions;
CREATE INDEX terminal_sessions_allocation ON terminal_sessions (allocation_id, created_at, id);
CREATE INDEX terminal_sessions_node ON terminal_sessions (node_id, created_at, id);
CREATE INDEX terminal_sessions_created ON terminal_sessions (created_at, id);

-- +goose Down
DELETE FROM terminal_sessions WHERE mode = 'vm_ssh';
CREATE TABLE terminal_sessions_v1 (
    id                 TEXT    NOT NULL PRIMARY KEY,
    allocation_id      TEXT    NOT NULL,
    node_id            TEXT    NOT NULL DEFAULT '',
    username           TEXT    NOT NULL DEFAULT '',
    mode               TEXT    NOT NULL CHECK (mode IN ('pty', 'serial')),
    instance_id        TEXT    NOT NULL DEFAULT '',
    token_hash         TEXT    NOT NULL UNIQUE,
    token_expires_at   BIGINT  NOT NULL DEFAULT 0,
    token_used_at      BIGINT  NOT NULL DEFAULT 0,
    state              TEXT    NOT NULL CHECK (state IN ('token_ready', 'browser_ws_ready', 'terminal_open_sent',
                                                         'node_stream_connected', 'pty_ready', 'failed')),
    states             TEXT    NOT NULL DEFAULT '',
    error_code         TEXT    NOT NULL DEFAULT '',
    error_message      TEXT    NOT NULL DEFAULT '',
    task_id            TEXT    NOT NULL DEFAULT '',
    correlation_id     TEXT    NOT NULL DEFAULT '',
    cols               INTEGER NOT NULL DEFAULT 0,
    term_rows          INTEGER NOT NULL DEFAULT 0,
    created_by         TEXT    NOT NULL DEFAULT '',
    created_at         BIGINT  NOT NULL DEFAULT 0,
    closed_at          BIGINT  NOT NULL DEFAULT 0,
    exit_code          INTEGER NOT NULL DEFAULT 0,
    exited             INTEGER NOT NULL DEFAULT 0 CHECK (exited IN (0, 1)),
    close_reason       TEXT    NOT NULL DEFAULT '',
    recording_path     TEXT    NOT NULL DEFAULT '',
    recording_bytes    BIGINT  NOT NULL DEFAULT 0,
    minted_by_token_id TEXT    NOT NULL DEFAULT ''
);
INSERT INTO terminal_sessions_v1 SELECT * FROM terminal_sessions;
DROP TABLE terminal_sessions;
ALTER TABLE terminal_sessions_v1 RENAME TO terminal_sessions;
CREATE INDEX terminal_sessions_allocation ON terminal_sessions (allocation_id, created_at, id);
CREATE INDEX terminal_sessions_node ON terminal_sessions (node_id, created_at, id);
CREATE INDEX terminal_sessions_created ON terminal_sessions (created_at, id);
