-- gRPC event consumers like webhooks (issue 23): delivered over TLS, verified against the system
-- roots or the CA the application registered with its consumer, and plaintext only where the
-- deployment allows http webhooks (the gateway decides at registration; the event router follows
-- the row). Consumers registered before are delivered over TLS: the release that adds this is
-- the first, and nothing in it may fall back to plaintext on its own.

-- +goose Up
ALTER TABLE applications
    ADD COLUMN consumer_grpc_plaintext boolean NOT NULL DEFAULT false,
    ADD COLUMN consumer_grpc_ca text,
    ADD CONSTRAINT applications_consumer_grpc_tls CHECK (
        (coalesce(consumer_kind, '') = 'grpc' OR (NOT consumer_grpc_plaintext AND consumer_grpc_ca IS NULL))
        AND NOT (consumer_grpc_plaintext AND consumer_grpc_ca IS NOT NULL));

-- +goose Down
ALTER TABLE applications
    DROP CONSTRAINT applications_consumer_grpc_tls,
    DROP COLUMN consumer_grpc_ca,
    DROP COLUMN consumer_grpc_plaintext;
