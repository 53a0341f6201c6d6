-- Slice allocations' provisioning workflows (internal/cp/sliceflow), their
-- recorded steps and the slot leases. Same portable conventions as 00001.
-- slice_workflows has one row per slice allocation (allocation_id); plan is
-- the leased slots' full slice.vm_provision parameters and the VM name,
-- result the VM's address, readiness and performance. slice_workflow_steps
-- records each step before its side effect, keyed by its idempotency key
-- (allocation id + "/" + step), so a restarted or other replica resumes
-- from the last recorded step. slot_leases makes a leased approved slot
-- exclusive: its primary key (host_id, slot_id) is what stops two
-- workflows from leasing the same slot.

-- +goose Up
CREATE TABLE slice_workflows (
    allocation_id     TEXT    NOT NULL PRIMARY KEY,
    host_id           TEXT    NOT NULL DEFAULT '',
    status            TEXT    NOT NULL CHECK (status IN ('provisioning', 'active', 'compensating', 'failed', 'releasing', 'released')),
    step              TEXT    NOT NULL DEFAULT '',
    spec              TEXT    NOT NULL DEFAULT '',
    plan              TEXT    NOT NULL DEFAULT '',
    result            TEXT    NOT NULL DEFAULT '',
    provision_task_id TEXT    NOT NULL DEFAULT '',
    release_task_id   TEXT    NOT NULL DEFAULT '',
    failed_step       TEXT    NOT NULL DEFAULT '',
    signal            TEXT    NOT NULL DEFAULT '',
    error             TEXT    NOT NULL DEFAULT '',
    correlation_id    TEXT    NOT NULL DEFAULT '',
    release_requested INTEGER NOT NULL DEFAULT 0,
    created_at        BIGINT  NOT NULL DEFAULT 0,
    updated_at        BIGINT  NOT NULL DEFAULT 0
);

CREATE INDEX slice_workflows_status ON slice_workflows (status, created_at, allocation_id);

CREATE TABLE slice_workflow_steps (
    idempotency_key TEXT   NOT NULL PRIMARY KEY,
    allocation_id   TEXT   NOT NULL,
    step            TEXT   NOT NULL,
    seq             BIGINT NOT NULL DEFAULT 0,
    state           TEXT   NOT NULL CHECK (state IN ('started', 'done', 'failed', 'skipped')),
    task_id         TEXT   NOT NULL DEFAULT '',
    detail          TEXT   NOT NULL DEFAULT '',
    started_at      BIGINT NOT NULL DEFAULT 0,
    ended_at        BIGINT NOT NULL DEFAULT 0
);

CREATE INDEX slice_workflow_steps_allocation ON slice_workflow_steps (allocation_id, seq);

CREATE TABLE slot_leases (
    host_id       TEXT   NOT NULL,
    slot_id       TEXT   NOT NULL,
    allocation_id TEXT   NOT NULL,
    leased_at     BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (host_id, slot_id)
);

CREATE INDEX slot_leases_allocation ON slot_leases (allocation_id);

-- +goose Down
DROP TABLE slot_leases;
DROP TABLE slice_workflow_steps;
DROP TABLE slice_workflows;
