-- Every operator action is audited, whatever the surface (issue 14): the gateway's server methods
-- (CancelExecution, RedeliverEvent, RedriveEvents) and the system endpoints (dead letters, API
-- keys) write the audit row themselves, for a call over the API as for one from the console. The
-- row says through which: 'console' or 'api'. Every row written before was the console's.

-- +goose Up
ALTER TABLE console_audit
    ADD COLUMN via text NOT NULL DEFAULT 'console' CHECK (via IN ('console', 'api'));
-- The default only back-fills the console's rows: a writer must say which surface it serves.
ALTER TABLE console_audit ALTER COLUMN via DROP DEFAULT;

-- +goose Down
ALTER TABLE console_audit DROP COLUMN via;
