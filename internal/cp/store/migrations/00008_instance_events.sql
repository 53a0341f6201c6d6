-- Instance status transitions (the instance page's timeline): one row per
-- creation, operator desired-state change and agent-reported phase or
-- reason change. seq numbers an instance's events from 1 in the order they
-- were recorded; sqlstore keeps at most the last 200 per instance and
-- deletes them with the instance record. Same portable conventions as
-- 00001.

-- +goose Up
CREATE TABLE instance_events (
    instance_id         TEXT   NOT NULL,
    seq                 BIGINT NOT NULL,
    at                  BIGINT NOT NULL DEFAULT 0,
    phase               TEXT   NOT NULL DEFAULT '',
    reason_code         TEXT   NOT NULL DEFAULT '',
    message             TEXT   NOT NULL DEFAULT '',
    desired_state       TEXT   NOT NULL DEFAULT '',
    generation          BIGINT NOT NULL DEFAULT 0,
    observed_generation BIGINT NOT NULL DEFAULT 0,
    actor               TEXT   NOT NULL DEFAULT '',
    correlation_id      TEXT   NOT NULL DEFAULT '',
    PRIMARY KEY (instance_id, seq)
);

CREATE INDEX instance_events_instance_at ON instance_events (instance_id, at);

-- +goose Down
DROP TABLE instance_events;
