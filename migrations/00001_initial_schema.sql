-- The shared schema of executions, their work outbox and their event outbox (docs/architecture.md §5).
-- Durations are stored in milliseconds; time scaling for tests happens in the services.

-- +goose Up
CREATE TABLE applications (
    id                 text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    name               text NOT NULL,
    -- SHA-256 of the API key: keys are long random tokens, so a fast hash is enough and lets the
    -- gateway find the application by its key.
    api_key_hash       bytea NOT NULL UNIQUE CHECK (length(api_key_hash) = 32),
    consumer_kind      text CHECK (consumer_kind IN ('webhook', 'grpc')),
    consumer_endpoint  text,
    -- The webhook signing secret, sealed with the deployment's secret key (AES-256-GCM).
    signing_secret_enc bytea,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CHECK ((consumer_kind IS NULL) = (consumer_endpoint IS NULL))
);

CREATE TABLE adapters (
    id              text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    name            text NOT NULL,
    endpoint        text NOT NULL,
    credential_hash bytea NOT NULL UNIQUE CHECK (length(credential_hash) = 32),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE capabilities (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,127}$'),
    adapter_id      text NOT NULL REFERENCES adapters (id),
    modes           text[] NOT NULL CHECK (modes <@ ARRAY['async', 'sync'] AND cardinality(modes) > 0),
    max_attempts    integer NOT NULL DEFAULT 10 CHECK (max_attempts > 0),
    async_budget_ms bigint NOT NULL DEFAULT 86400000 CHECK (async_budget_ms > 0),
    retry_delays_ms bigint[] NOT NULL DEFAULT ARRAY[60000, 300000, 1800000, 7200000, 21600000]::bigint[]
                    CHECK (cardinality(retry_delays_ms) > 0),
    lease_ms        bigint NOT NULL DEFAULT 300000 CHECK (lease_ms > 0),
    sync_timeout_ms bigint NOT NULL DEFAULT 30000 CHECK (sync_timeout_ms > 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX capabilities_adapter_id_idx ON capabilities (adapter_id);

CREATE TABLE executions (
    id               uuid PRIMARY KEY,
    application_id   text NOT NULL REFERENCES applications (id),
    capability       text NOT NULL REFERENCES capabilities (name),
    mode             text NOT NULL CHECK (mode IN ('async', 'sync')),
    status           text NOT NULL CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    attempt          integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     integer NOT NULL CHECK (max_attempts > 0),
    payload          jsonb NOT NULL,
    -- SHA-256 of the canonical request, to tell a retried request from a different one that
    -- reuses an idempotency key.
    request_hash     bytea NOT NULL,
    result           jsonb,
    failure_class    text,
    failure_reason   text,
    failure_code     text,
    failure_message  text,
    idempotency_key  text,
    progress         jsonb,
    deadline_at      timestamptz NOT NULL,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    settled_at       timestamptz,
    UNIQUE (application_id, idempotency_key),
    CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (settled_at IS NOT NULL)),
    CHECK (attempt <= max_attempts)
);
-- ListExecutions: an application's executions, newest first (ids are time-ordered).
CREATE INDEX executions_application_id_id_idx ON executions (application_id, id DESC);
-- The lease sweeper.
CREATE INDEX executions_running_lease_idx ON executions (lease_expires_at) WHERE status = 'running';

CREATE TABLE execution_attempts (
    execution_id        uuid NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    n                   integer NOT NULL CHECK (n > 0),
    started_at          timestamptz NOT NULL DEFAULT now(),
    ended_at            timestamptz,
    -- succeeded, failed, accepted (long work under way), timeout, cancelled
    outcome             text,
    failure_class       text,
    failure_code        text,
    failure_message     text,
    -- SHA-256 of the per-attempt callback token.
    callback_token_hash bytea NOT NULL CHECK (length(callback_token_hash) = 32),
    PRIMARY KEY (execution_id, n)
);

-- The work outbox: one row per attempt to start, deleted once published to the broker.
CREATE TABLE dispatches (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    execution_id  uuid NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    attempt       integer NOT NULL CHECK (attempt > 0),
    due_at        timestamptz NOT NULL DEFAULT now(),
    claimed_until timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (execution_id, attempt)
);
CREATE INDEX dispatches_due_at_idx ON dispatches (due_at);

-- The event outbox: written only by a winning settlement, in its transaction.
CREATE TABLE integration_events (
    id                  uuid PRIMARY KEY,
    application_id      text NOT NULL REFERENCES applications (id),
    execution_id        uuid NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    type                text NOT NULL,
    payload             jsonb NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    -- Relay to the broker.
    relayed_at          timestamptz,
    relay_claimed_until timestamptz,
    -- Delivery to the application's consumer.
    delivery_status     text NOT NULL DEFAULT 'pending' CHECK (delivery_status IN ('pending', 'delivered', 'dead')),
    attempts            integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at     timestamptz,
    last_error          text,
    delivered_at        timestamptz,
    dead_at             timestamptz,
    UNIQUE (execution_id, type)
);
CREATE INDEX integration_events_unrelayed_idx ON integration_events (created_at) WHERE relayed_at IS NULL;
CREATE INDEX integration_events_application_id_id_idx ON integration_events (application_id, id DESC);

CREATE TABLE event_deliveries (
    event_id    uuid NOT NULL REFERENCES integration_events (id) ON DELETE CASCADE,
    n           integer NOT NULL CHECK (n > 0),
    at          timestamptz NOT NULL DEFAULT now(),
    status_code integer,
    error       text,
    duration_ms integer NOT NULL CHECK (duration_ms >= 0),
    PRIMARY KEY (event_id, n)
);

-- +goose Down
DROP TABLE event_deliveries;
DROP TABLE integration_events;
DROP TABLE dispatches;
DROP TABLE execution_attempts;
DROP TABLE executions;
DROP TABLE capabilities;
DROP TABLE adapters;
DROP TABLE applications;
