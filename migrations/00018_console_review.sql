-- The console's second pass (issue 14).
--
-- Progress at its own time: the timeline placed an execution's last progress at its settlement,
-- because no time was kept. As 00013 did for lease renewals, reports are not kept one row each
-- (an adapter may report every second for hours): the statement that stores a report counts it
-- on the attempt's row and keeps the last one's time.
--
-- The audit log's actor was an application id or the word 'operator' — which is also a valid
-- application id, so an application named "operator" read the operator's entries as its own.
-- The role now says who acted; entries written before it with actor 'operator' were the admin
-- token's (no such application existed in any deployment yet).
--
-- Signing out ends a console session everywhere: the sealed cookie alone would stay valid until
-- its expiry if it had been copied. An ended session's id is kept until that expiry and every
-- request checks it.

-- +goose Up
ALTER TABLE execution_attempts
    ADD COLUMN progress_reports integer NOT NULL DEFAULT 0 CHECK (progress_reports >= 0),
    ADD COLUMN last_progress_at timestamptz,
    ADD CHECK ((progress_reports = 0) = (last_progress_at IS NULL));

ALTER TABLE console_audit
    ADD COLUMN role text NOT NULL DEFAULT 'application' CHECK (role IN ('application', 'operator'));
UPDATE console_audit SET role = 'operator' WHERE actor = 'operator';
-- An application's page reads its own entries: (role, actor) names it.
DROP INDEX console_audit_actor_id_idx;
CREATE INDEX console_audit_role_actor_id_idx ON console_audit (role, actor, id DESC);

CREATE TABLE console_sessions_ended (
    id         uuid        PRIMARY KEY,
    -- The session's own expiry: after it the cookie is refused anyway and the row can go.
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE console_sessions_ended;
DROP INDEX console_audit_role_actor_id_idx;
CREATE INDEX console_audit_actor_id_idx ON console_audit (actor, id DESC);
ALTER TABLE console_audit DROP COLUMN role;
ALTER TABLE execution_attempts
    DROP COLUMN last_progress_at,
    DROP COLUMN progress_reports;
