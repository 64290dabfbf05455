-- API keys with a lifecycle (issue 11): several per application, so that a rotation overlaps;
-- each revocable, optionally expiring, with the time it was last used.
--
-- A key is stored as the SHA-256 of the whole token. A generated key (igk_<id>_<secret><crc>)
-- is found by its id, the row's primary key, and its hash compared in constant time; a key an
-- operator chose for the catalog (kind 'chosen', source 'catalog') has no id in its text and is
-- found by its hash. The keys in applications.api_key_hash become the applications' catalog keys.
--
-- applications.api_key_hash is no longer read: the gateway authenticates from api_keys only (a
-- key revoked there must not live on in another column). The catalog still writes it, so that
-- gateways of the previous release keep authenticating catalog keys during a rolling upgrade; a
-- later migration drops it. Revoking a catalog key overwrites it with the SHA-256 of random
-- bytes (and catalog apply writes such a value while the catalog key is revoked), so a revoked
-- key stays dead for those gateways, after a rollback and after this migration's Down.
-- integrationsctl must be upgraded with this migration: an older one writes only that column.

-- +goose Up
CREATE TABLE api_keys (
    -- A generated key's id (12 base62); a chosen key's is 'chosen_' and 12 hex digits.
    id             text PRIMARY KEY CHECK (id ~ '^([0-9A-Za-z]{12}|chosen_[0-9a-f]{12})$'),
    application_id text NOT NULL REFERENCES applications (id),
    kind           text NOT NULL CHECK (kind IN ('generated', 'chosen')),
    hash           bytea NOT NULL UNIQUE CHECK (length(hash) = 32),
    source         text NOT NULL CHECK (source IN ('catalog', 'api')),
    description    text NOT NULL DEFAULT '',
    created_by     text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz,
    revoked_at     timestamptz,
    last_used_at   timestamptz,
    CHECK (kind = 'generated' OR source = 'catalog'),
    CHECK ((kind = 'generated') = (id !~ '^chosen_'))
);
CREATE INDEX api_keys_application_id_idx ON api_keys (application_id, created_at);
-- The catalog declares at most one key per application.
CREATE UNIQUE INDEX api_keys_one_catalog_key_idx ON api_keys (application_id) WHERE source = 'catalog';

INSERT INTO api_keys (id, application_id, kind, hash, source, description, created_by, created_at)
SELECT 'chosen_' || left(md5(gen_random_uuid()::text), 12), id, 'chosen', api_key_hash, 'catalog',
       'catalog key (migrated)', 'migration 00009', created_at
FROM applications;

-- +goose Down
-- Keys created through the API are lost; catalog keys still have their hash in applications
-- (a revoked one an unusable hash: it stays revoked).
DROP TABLE api_keys;
