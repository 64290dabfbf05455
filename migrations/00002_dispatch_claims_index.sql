-- The dispatcher's timed wake-up asks when the earliest claimed record's claim expires; without
-- this index that is a scan of every waiting record on every pass.

-- +goose Up
CREATE INDEX dispatches_claimed_until_idx ON dispatches (claimed_until) WHERE claimed_until IS NOT NULL;

-- +goose Down
DROP INDEX dispatches_claimed_until_idx;
