-- Approved node resource slots (seed 004: discovery proposes candidate
-- slots; only an operator's approval makes one schedulable). Same portable
-- conventions as 00001.

-- +goose Up
CREATE TABLE host_slots (
    host_id      TEXT    NOT NULL,
    slot_id      TEXT    NOT NULL,
    slot_index   INTEGER NOT NULL,
    spec         TEXT    NOT NULL DEFAULT '',
    source_task  TEXT    NOT NULL DEFAULT '',
    approved_by  TEXT    NOT NULL DEFAULT '',
    approved_at  BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (host_id, slot_id)
);

-- +goose Down
DROP TABLE host_slots;
