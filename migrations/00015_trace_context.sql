-- Tracing (pkg/telemetry): an execution's trace runs through tables and queues, not only calls.
-- The gateway's accept stores the W3C trace context of the accept's span on the execution's row;
-- the dispatcher publishes each dispatch in that trace, and settlement copies it onto the
-- completion event's row, so that the event-router's relay and delivery continue it. NULL: no
-- trace (tracing off with no traceparent from the caller, or a row written before this).

-- +goose Up
ALTER TABLE executions
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate  text;
ALTER TABLE integration_events
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate  text;

-- +goose Down
ALTER TABLE integration_events
    DROP COLUMN tracestate,
    DROP COLUMN traceparent;
ALTER TABLE executions
    DROP COLUMN tracestate,
    DROP COLUMN traceparent;
