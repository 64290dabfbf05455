-- Index and row hygiene (issue 13 item 6).
--
-- integration_events_execution_id_idx (execution_id) duplicated the leading column of the
-- unique constraint's index integration_events_execution_id_type_key (execution_id, type): every
-- lookup by execution (the events API's execution filter, the cascade from executions) uses that
-- one as well, and each event insert and each non-HOT event update wrote one index entry more.
--
-- execution_attempts and integration_events are updated in place several times per execution
-- (an attempt is closed, accepted or given a late outcome; an event is claimed for relay and for
-- delivery) by statements that change no indexed column, so each can be a HOT update, writing no
-- index entry, if the row's page has room for the new version. Rows are inserted at the table's
-- end and updated within milliseconds, on pages the inserts have just filled; a fillfactor of 80
-- keeps a fifth of each new page for those versions. It applies to pages written from now on; no
-- rewrite is needed, and ALTER TABLE ... SET takes only a SHARE UPDATE EXCLUSIVE lock.

-- +goose Up
DROP INDEX integration_events_execution_id_idx;
ALTER TABLE execution_attempts SET (fillfactor = 80);
ALTER TABLE integration_events SET (fillfactor = 80);

-- +goose Down
ALTER TABLE integration_events RESET (fillfactor);
ALTER TABLE execution_attempts RESET (fillfactor);
CREATE INDEX integration_events_execution_id_idx ON integration_events (execution_id);
