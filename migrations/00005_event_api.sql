-- Signing secret rotation: the previous secret stays (sealed) beside the new one until
-- signing_secret_prev_until, so that the event router signs each delivery with both during the
-- overlap and receivers can switch secrets without refusing a delivery. The truncated answer of
-- each delivery attempt is kept for the events API. Listing an application's events by status
-- (dead ones, for a redrive) or by execution uses the indexes below.

-- +goose Up
ALTER TABLE applications
    ADD COLUMN signing_secret_prev_enc   bytea,
    ADD COLUMN signing_secret_prev_until timestamptz,
    ADD CHECK ((signing_secret_prev_enc IS NULL) = (signing_secret_prev_until IS NULL));

ALTER TABLE event_deliveries ADD COLUMN response_body text;

CREATE INDEX integration_events_application_id_status_id_idx
    ON integration_events (application_id, delivery_status, id DESC);
CREATE INDEX integration_events_execution_id_idx ON integration_events (execution_id);

-- +goose Down
DROP INDEX integration_events_execution_id_idx;
DROP INDEX integration_events_application_id_status_id_idx;
ALTER TABLE event_deliveries DROP COLUMN response_body;
ALTER TABLE applications
    DROP COLUMN signing_secret_prev_until,
    DROP COLUMN signing_secret_prev_enc;
