-- The execution timeline (GetExecutionTimeline) shows an attempt's lease renewals. Renewals are
-- not kept one row each (an adapter may renew every few seconds for hours): the statement that
-- renews the lease counts them on the attempt's row and keeps the last one's time.

-- +goose Up
ALTER TABLE execution_attempts
    ADD COLUMN renewals        integer NOT NULL DEFAULT 0 CHECK (renewals >= 0),
    ADD COLUMN last_renewed_at timestamptz,
    ADD CHECK ((renewals = 0) = (last_renewed_at IS NULL));

-- +goose Down
ALTER TABLE execution_attempts
    DROP COLUMN last_renewed_at,
    DROP COLUMN renewals;
