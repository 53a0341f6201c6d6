-- Declarative instances (seed 001) and host draining. Same portable
-- conventions as 00001. "group" is a reserved word, hence group_name.
-- Instance names are unique among all records, including those whose
-- desired state is deleted but whose agent has not confirmed the stop yet.

-- +goose Up
ALTER TABLE hosts ADD COLUMN draining INTEGER NOT NULL DEFAULT 0 CHECK (draining IN (0, 1));

CREATE TABLE instances (
    id                  TEXT    NOT NULL PRIMARY KEY,
    name                TEXT    NOT NULL UNIQUE,
    group_name          TEXT    NOT NULL DEFAULT '',
    host_id             TEXT    NOT NULL,
    labels              TEXT    NOT NULL DEFAULT '',
    spec                TEXT    NOT NULL DEFAULT '',
    desired_state       TEXT    NOT NULL CHECK (desired_state IN ('running', 'stopped', 'deleted')),
    generation          BIGINT  NOT NULL DEFAULT 1,
    phase               TEXT    NOT NULL DEFAULT 'Pending',
    reason_code         TEXT    NOT NULL DEFAULT '',
    message             TEXT    NOT NULL DEFAULT '',
    observed_generation BIGINT  NOT NULL DEFAULT 0,
    runtime             TEXT    NOT NULL DEFAULT '',
    created_by          TEXT    NOT NULL DEFAULT '',
    created_at          BIGINT  NOT NULL DEFAULT 0,
    updated_at          BIGINT  NOT NULL DEFAULT 0,
    status_at           BIGINT  NOT NULL DEFAULT 0
);

CREATE INDEX instances_host ON instances (host_id, id);
CREATE INDEX instances_group ON instances (group_name, name);

-- +goose Down
DROP TABLE instances;
ALTER TABLE hosts DROP COLUMN draining;
