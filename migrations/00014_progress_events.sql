-- Progress events (issue 14 part 5). A capability may declare progress_events: then each progress
-- report of an async execution writes an execution.progress event into the outbox, beside the
-- execution's one completion event, and the event router delivers them in order.
--
-- An execution may now have many events, so UNIQUE (execution_id, type) goes. Every event of an
-- execution has a sequence number (1, 2, ...), unique per execution: that index serves every
-- lookup by execution (the events API's execution filter, the timeline, the cascade) and the
-- router's ordering rule ("is an earlier event of this execution still pending?"). One completion
-- per execution stays a constraint, as a partial unique index on the completion events alone.
--
-- Sequence numbers come from a counter on the execution's row (event_seq), incremented by the
-- statement that writes the event: both writers (a progress report, a settlement) update that row
-- anyway, so the row lock they already take orders them, and the counter is read from the row's
-- latest version even when the statement waited for the lock (a max(sequence) subquery would read
-- the statement's older snapshot). Events written before this migration are each their
-- execution's only event: sequence 1. Their executions' counters stay 0: settled, they write no
-- event again, and counting them would rewrite every settled execution while this migration
-- holds executions locked against every read and write (its ALTER TABLE, until the commit).

-- +goose Up
ALTER TABLE capabilities ADD COLUMN progress_events boolean NOT NULL DEFAULT false;

ALTER TABLE executions ADD COLUMN event_seq integer NOT NULL DEFAULT 0 CHECK (event_seq >= 0);

ALTER TABLE integration_events ADD COLUMN sequence integer NOT NULL DEFAULT 1 CHECK (sequence > 0);
ALTER TABLE integration_events ADD CONSTRAINT integration_events_execution_id_sequence_key UNIQUE (execution_id, sequence);
ALTER TABLE integration_events DROP CONSTRAINT integration_events_execution_id_type_key;
CREATE UNIQUE INDEX integration_events_completion_key ON integration_events (execution_id)
    WHERE type = 'execution.completed';

-- +goose Down
DELETE FROM integration_events WHERE type = 'execution.progress';
DROP INDEX integration_events_completion_key;
ALTER TABLE integration_events ADD CONSTRAINT integration_events_execution_id_type_key UNIQUE (execution_id, type);
ALTER TABLE integration_events DROP CONSTRAINT integration_events_execution_id_sequence_key;
ALTER TABLE integration_events DROP COLUMN sequence;
ALTER TABLE executions DROP COLUMN event_seq;
ALTER TABLE capabilities DROP COLUMN progress_events;
