-- The sweeper settles pending executions stranded past their deadline (no dispatch record left);
-- this index keeps that query off a scan of every pending execution.

-- +goose Up
CREATE INDEX executions_pending_deadline_idx ON executions (deadline_at) WHERE status = 'pending';

-- +goose Down
DROP INDEX executions_pending_deadline_idx;
