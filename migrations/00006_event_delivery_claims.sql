-- A deliverer claims a pending event for the length of one delivery attempt before it calls the
-- consumer, so that two copies of its notice (a duplicate relay, a redelivery, a notice the broker
-- handed out again after a crash) do not deliver it twice at once, from one replica or several.
-- A claim whose holder died expires; the notice the broker returns waits until then.

-- +goose Up
ALTER TABLE integration_events ADD COLUMN delivery_claimed_until timestamptz;

-- +goose Down
ALTER TABLE integration_events DROP COLUMN delivery_claimed_until;
