package catalog_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

type keyRow struct {
	ID, Application, Kind, Source string
	Hash                          []byte
	Revoked                       bool
}

func keyRows(t *testing.T, pool *pgxpool.Pool) []keyRow {
	t.Helper()
	r, err := pool.Query(context.Background(),
		`SELECT id, application_id, kind, source, hash, revoked_at IS NOT NULL FROM api_keys ORDER BY application_id, source, id`)
	require.NoError(t, err)
	defer r.Close()
	var out []keyRow
	for r.Next() {
		var k keyRow
		require.NoError(t, r.Scan(&k.ID, &k.Application, &k.Kind, &k.Source, &k.Hash, &k.Revoked))
		out = append(out, k)
	}
	require.NoError(t, r.Err())
	return out
}

func applyYAML(t *testing.T, pool *pgxpool.Pool, yaml string) error {
	t.Helper()
	c, err := catalog.Parse([]byte(yaml), env(nil))
	require.NoError(t, err)
	return catalog.Apply(context.Background(), pool, c)
}

func TestApplyMakesTheDeclaredKeyTheCatalogKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)

	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{})))
	first := keyRows(t, s.Pool)
	require.Len(t, first, 1)
	sum := sha256.Sum256([]byte(testAPIKey))
	require.Equal(t, keyRow{ID: first[0].ID, Application: "app", Kind: "chosen", Source: "catalog", Hash: sum[:]}, first[0])
	require.Regexp(t, `^chosen_[0-9a-f]{12}$`, first[0].ID)

	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{})))
	require.Equal(t, first, keyRows(t, s.Pool), "applying the same key again keeps its row (and its last-used time)")

	// A key created through the API stays whatever the catalog declares next.
	apiKey, err := apikey.Generate()
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `INSERT INTO api_keys (id, application_id, kind, hash, source) VALUES ($1, 'app', 'generated', $2, 'api')`,
		apiKey.ID, apikey.Hash(apiKey.Token))
	require.NoError(t, err)

	// A generated key declared in the catalog replaces the chosen one, under its own id.
	gen, err := apikey.Generate()
	require.NoError(t, err)
	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{appKey: gen.Token})))
	got := keyRows(t, s.Pool)
	require.Equal(t, []keyRow{
		{ID: apiKey.ID, Application: "app", Kind: "generated", Source: "api", Hash: apikey.Hash(apiKey.Token)},
		{ID: gen.ID, Application: "app", Kind: "generated", Source: "catalog", Hash: apikey.Hash(gen.Token)},
	}, got)

	// A hash declared as such becomes a chosen key found by its hash.
	other := sha256.Sum256([]byte("a key that only its owner knows"))
	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{appKeySHA: hex.EncodeToString(other[:])})))
	got = keyRows(t, s.Pool)
	require.Len(t, got, 2)
	require.Equal(t, apiKey.ID, got[0].ID, "the API key is still there")
	require.Equal(t, other[:], got[1].Hash)
	require.Equal(t, "chosen", got[1].Kind)
}

func TestApplyKeepsARevokedCatalogKeyRevoked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)

	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{})))
	_, err := s.Pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now()`)
	require.NoError(t, err)
	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{})))
	got := keyRows(t, s.Pool)
	require.Len(t, got, 1)
	require.True(t, got[0].Revoked, "re-applying a catalog does not bring back a key an operator revoked")
	legacy := func() []byte {
		var h []byte
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT api_key_hash FROM applications WHERE id = 'app'`).Scan(&h))
		return h
	}
	dead := legacy()
	require.Len(t, dead, 32)
	require.NotEqual(t, apikey.Hash(testAPIKey), dead,
		"the column gateways before migration 00009 read does not get the revoked key's hash")

	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{appKey: testAPIKey + "-rotated"})))
	got = keyRows(t, s.Pool)
	require.Len(t, got, 1)
	require.False(t, got[0].Revoked, "a new key in the catalog replaces the revoked one")
	require.Equal(t, apikey.Hash(testAPIKey+"-rotated"), legacy(), "and is written to the legacy column")
}

func TestApplyRefusesAKeyOfAnotherApplication(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)

	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{})))
	apiKey, err := apikey.Generate()
	require.NoError(t, err)
	_, err = s.Pool.Exec(context.Background(), `INSERT INTO api_keys (id, application_id, kind, hash, source) VALUES ($1, 'app', 'generated', $2, 'api')`,
		apiKey.ID, apikey.Hash(apiKey.Token))
	require.NoError(t, err)
	before := keyRows(t, s.Pool)
	err = applyYAML(t, s.Pool, catalogYAML(t, spec{appKey: apiKey.Token}))
	require.ErrorContains(t, err, "application app: api_key is already another key")
	require.Equal(t, before, keyRows(t, s.Pool), "nothing is written")
}

func TestValidationRefusesKeysTheGatewayWouldNot(t *testing.T) {
	t.Parallel()
	k, err := apikey.Generate()
	require.NoError(t, err)
	typo := k.Token[:30] + string(k.Token[30]^1) + k.Token[31:]
	for _, key := range []string{typo, "key-with-a-tab\t0123456789", " key-with-a-leading-space", "key-with-a-trailing-space ", strings.Repeat("k", apikey.MaxTokenLen+1)} {
		_, err := catalog.Parse([]byte(catalogYAML(t, spec{appKey: key})), env(nil))
		require.ErrorContains(t, err, "applications[0].api_key: ")
		require.NotContains(t, err.Error(), key, "the error does not echo the key")
	}
}

// catalogKeyWeak reads api_keys.weak of the application's catalog key: nil when never judged.
func catalogKeyWeak(t *testing.T, pool *pgxpool.Pool, appID string) *bool {
	t.Helper()
	var weak *bool
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT weak FROM api_keys WHERE application_id = $1 AND source = 'catalog'`, appID).Scan(&weak))
	return weak
}

func TestApplyRecordsWhetherAClearKeyIsWeak(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	strong := "q8ZxW2vN0pL5tR7yB1cD4fG6hJ9kM3sA" // head -c 24 /dev/urandom | base64
	weakSum := sha256.Sum256([]byte(testAPIKey))

	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{})))
	require.Equal(t, new(true), catalogKeyWeak(t, s.Pool, "app"), "23 typed characters: weak")

	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{appKey: strong})))
	require.Equal(t, new(false), catalogKeyWeak(t, s.Pool, "app"), "32 random-looking characters: not weak")

	gen, err := apikey.Generate()
	require.NoError(t, err)
	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{appKey: gen.Token})))
	require.Equal(t, new(false), catalogKeyWeak(t, s.Pool, "app"), "a generated key is random")

	unseen := sha256.Sum256([]byte("a key only its owner has seen"))
	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{appKeySHA: hex.EncodeToString(unseen[:])})))
	require.Nil(t, catalogKeyWeak(t, s.Pool, "app"), "a key given by its hash cannot be judged")

	// The same weak key again, first in clear, then by its hash: the hash names the key it was,
	// and keeps its verdict.
	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{})))
	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{appKeySHA: hex.EncodeToString(weakSum[:])})))
	require.Equal(t, new(true), catalogKeyWeak(t, s.Pool, "app"), "declaring a weak key by its hash does not make it strong")

	// A row with no verdict (applied before migration 00021) gets one when the catalog is
	// applied again with the key in clear, the row itself kept.
	_, err = s.Pool.Exec(ctx, `UPDATE api_keys SET weak = NULL`)
	require.NoError(t, err)
	before := keyRows(t, s.Pool)
	require.NoError(t, applyYAML(t, s.Pool, catalogYAML(t, spec{})))
	require.Equal(t, new(true), catalogKeyWeak(t, s.Pool, "app"))
	require.Equal(t, before, keyRows(t, s.Pool), "the same key keeps its row")
}

func TestWeakAPIKeysNameTheFieldNeverTheKey(t *testing.T) {
	t.Parallel()
	const devDefault = "dev-api-key-change-me" // make run's INTEGRATIONS_DEV_API_KEY
	c, err := catalog.Parse(readDevCatalog(t), env(map[string]string{
		"INTEGRATIONS_DEV_API_KEY":              devDefault,
		"INTEGRATIONS_DUMMY_ADAPTER_ADDR":       "127.0.0.1:50070",
		"INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL": "dummy-credential-0123456789",
	}))
	require.NoError(t, err)
	weak := c.WeakAPIKeys()
	require.Equal(t, []catalog.WeakKey{{
		Field: "applications[0].api_key", ApplicationID: "dev-app",
		Variables: []string{"INTEGRATIONS_DEV_API_KEY"}, Problem: "21 characters, fewer than 32",
	}}, weak)
	require.Equal(t, "applications[0].api_key of application dev-app (set from INTEGRATIONS_DEV_API_KEY) "+
		"does not look like 32 random bytes (21 characters, fewer than 32)", weak[0].String())

	gen, err := apikey.Generate()
	require.NoError(t, err)
	sum := sha256.Sum256([]byte("x"))
	c, err = catalog.Parse([]byte(`
applications:
  - id: strong
    api_key: `+gen.Token+`
  - id: by-hash
    api_key_sha256: `+hex.EncodeToString(sum[:])+`
  - id: literal
    api_key: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
  - id: two-vars
    api_key: ${FIRST}-${SECOND}
  - id: strong-vars
    api_key: ${FIRST}${SECOND}${FIRST}${SECOND}
`), env(map[string]string{"FIRST": "Zx81qPw0", "SECOND": "mT4vB7nK"}))
	require.NoError(t, err)
	require.Equal(t, []catalog.WeakKey{{
		Field: "applications[2].api_key", ApplicationID: "literal", Problem: "only 1 distinct characters, fewer than 10",
	}, {
		Field: "applications[3].api_key", ApplicationID: "two-vars", Variables: []string{"FIRST", "SECOND"},
		Problem: "17 characters, fewer than 32",
	}}, c.WeakAPIKeys(), "the generated, hashed and long enough keys are not listed; a literal key has no variable to name")
	for _, w := range c.WeakAPIKeys() {
		require.NotContains(t, w.String(), "aaaa")
		require.NotContains(t, w.String(), "Zx81qPw0")
	}
}
