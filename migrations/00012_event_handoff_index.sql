-- An event the relay hands to its own deliverer in process is relayed with relay_claimed_until
-- set to its delivery claim's end, until its attempt is recorded or released: the mark of a
-- hand-off not yet done. The relay's recovery looks for marks past their time (the replica died
-- holding the event) to publish those events again; this index holds only the hand-offs in flight.

-- +goose Up
CREATE INDEX integration_events_handoff_idx ON integration_events (relay_claimed_until)
    WHERE relayed_at IS NOT NULL AND relay_claimed_until IS NOT NULL;

-- +goose Down
DROP INDEX integration_events_handoff_idx;
