-- Weak catalog keys (issue 23, part 8): the gateway holds only a key's SHA-256, so it cannot judge
-- a key it never saw in clear. `catalog apply` sees a catalog key given as `api_key` in clear,
-- judges it with apikey.WeakSecret and records the verdict here; the gateway refuses to start
-- while an active key recorded weak exists, unless every listener is on loopback (then it warns).
--
-- NULL means never judged: a catalog key given only as `api_key_sha256` (the operator's
-- responsibility), a catalog key applied before this migration (judged by the next apply, which the
-- migration Job runs right after migrating), and every key created through the API (generated, 256
-- random bits by construction). Only catalog keys are judged.

-- +goose Up
ALTER TABLE api_keys
    ADD COLUMN weak boolean,
    ADD CONSTRAINT api_keys_weak_catalog CHECK (weak IS NULL OR source = 'catalog');

-- +goose Down
ALTER TABLE api_keys
    DROP CONSTRAINT api_keys_weak_catalog,
    DROP COLUMN weak;
