-- The sweeper claims running executions whose lease expired (executions_running_lease_idx) or
-- whose deadline passed; without this index the second half is a scan of every running execution
-- on every pass.

-- +goose Up
CREATE INDEX executions_running_deadline_idx ON executions (deadline_at) WHERE status = 'running';

-- +goose Down
DROP INDEX executions_running_deadline_idx;
