-- The relay looks for pending events whose notice should long have come back (lost, e.g. dead-
-- lettered while the database was unreachable); this index keeps that off a scan of every event.

-- +goose Up
CREATE INDEX integration_events_pending_due_idx ON integration_events ((greatest(coalesce(next_attempt_at, relayed_at), relayed_at)))
    WHERE delivery_status = 'pending';

-- +goose Down
DROP INDEX integration_events_pending_due_idx;
