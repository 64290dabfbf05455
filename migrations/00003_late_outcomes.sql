-- An adapter's outcome that arrives after its attempt ended (the execution settled, a later attempt
-- started, or the lease expired and was swept) is refused, and recorded on the attempt for audit.

-- +goose Up
ALTER TABLE execution_attempts
    ADD COLUMN late_outcome text CHECK (late_outcome IN ('succeeded', 'failed')),
    ADD COLUMN late_at      timestamptz,
    ADD CHECK ((late_outcome IS NULL) = (late_at IS NULL));

-- +goose Down
ALTER TABLE execution_attempts
    DROP COLUMN late_at,
    DROP COLUMN late_outcome;
