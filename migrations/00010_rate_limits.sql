-- Rate limits per application (issue 11): invokes and reads are limited separately, each by a token
-- bucket of a rate (per second) and a burst. NULL takes the deployment's default
-- (INTEGRATIONS_RATE_LIMIT_*); a rate of 0 is unlimited.
--
-- gateway_replicas is each gateway's heartbeat: a replica takes limit / (live replicas) as its
-- share, counting the rows seen within a few heartbeats, so that N replicas do not admit N times
-- the limit (docs/decisions.md, "Rate limits per application (issue 11)").

-- +goose Up
ALTER TABLE applications
    ADD COLUMN invokes_per_second double precision CHECK (invokes_per_second >= 0),
    ADD COLUMN invoke_burst       integer          CHECK (invoke_burst >= 1),
    ADD COLUMN reads_per_second   double precision CHECK (reads_per_second >= 0),
    ADD COLUMN read_burst         integer          CHECK (read_burst >= 1);

CREATE TABLE gateway_replicas (
    id        text PRIMARY KEY,
    last_seen timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE gateway_replicas;
ALTER TABLE applications
    DROP COLUMN invokes_per_second,
    DROP COLUMN invoke_burst,
    DROP COLUMN reads_per_second,
    DROP COLUMN read_burst;
