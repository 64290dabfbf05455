-- The event router's ordering rule (00014, docs/decisions.md "Progress events") keeps an event
-- unrelayed while an earlier event of its execution is pending. The relay's scan of unrelayed
-- events (integration_events_unrelayed_idx, in created_at order) then walked every such held
-- event, each with a probe of its execution's events, on every pass and every NOTIFY, before it
-- reached one it could claim: with a receiver down, every execution's completion waits behind a
-- progress event in retry backoff, for hours. A held event is now set aside (held) by the relay,
-- out of the scan's index, and let go when its predecessor is delivered or dead; the held index
-- holds only those, for the recovery that lets go of the ones a race left behind.

-- +goose Up
ALTER TABLE integration_events ADD COLUMN held boolean NOT NULL DEFAULT false;
DROP INDEX integration_events_unrelayed_idx;
CREATE INDEX integration_events_unrelayed_idx ON integration_events (created_at) WHERE relayed_at IS NULL AND NOT held;
CREATE INDEX integration_events_held_idx ON integration_events (created_at) WHERE held;

-- +goose Down
DROP INDEX integration_events_held_idx;
DROP INDEX integration_events_unrelayed_idx;
CREATE INDEX integration_events_unrelayed_idx ON integration_events (created_at) WHERE relayed_at IS NULL;
ALTER TABLE integration_events DROP COLUMN held;
