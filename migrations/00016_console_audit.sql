-- The console's audit log: every action taken through the console (a redelivery, a redrive of
-- dead events or of a route's dead letters, a sign-in), who took it and when. The detail holds
-- counts and filters, never a payload. An application reads the entries of its own actions
-- (actor = its id), the operator every entry.

-- +goose Up
CREATE TABLE console_audit (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    -- An application id, or 'operator' for the admin token.
    actor    text        NOT NULL CHECK (actor <> ''),
    action   text        NOT NULL CHECK (action <> ''),
    -- What the action was taken on: an event id, a route, a time filter; '' when nothing.
    target   text        NOT NULL DEFAULT '',
    detail   jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(detail) = 'object')
);
-- The audit page: one actor's entries (or everyone's), newest first.
CREATE INDEX console_audit_actor_id_idx ON console_audit (actor, id DESC);

-- +goose Down
DROP TABLE console_audit;
