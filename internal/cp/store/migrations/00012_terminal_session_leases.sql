-- Terminal session leases: the replica that holds a live terminal session
-- (its browser WebSocket and the node's stream) renews the session's lease
-- while it runs and deletes it when the session ends. A lease past its
-- lease_until means the replica died without closing the session: a
-- surviving replica's sweeper (internal/cp/termgw) marks the session failed
-- and deletes the lease. replica is the holder's advertised node-facing URL
-- (or its node URL), for the failure message. Same portable conventions as
-- 00001 (times are Unix milliseconds).

-- +goose Up
CREATE TABLE terminal_session_leases (
    session_id  TEXT   NOT NULL PRIMARY KEY,
    replica     TEXT   NOT NULL DEFAULT '',
    lease_until BIGINT NOT NULL
);
CREATE INDEX terminal_session_leases_until ON terminal_session_leases (lease_until);

-- +goose Down
DROP TABLE terminal_session_leases;
