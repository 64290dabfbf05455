package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// callAuth runs the interceptor for a GatewayService call with the given Authorization value and
// returns the application the handler saw.
func callAuth(t *testing.T, st *store.Store, authorization string) (string, error) {
	t.Helper()
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", authorization))
	var app string
	_, err := AuthInterceptor(st, nil, "")(ctx, nil, &grpc.UnaryServerInfo{Server: &Server{}},
		func(ctx context.Context, _ any) (any, error) { app = applicationID(ctx); return nil, nil })
	return app, err
}

func requireRefused(t *testing.T, err error, message string) {
	t.Helper()
	st := grpcx.ToStatus(err)
	require.Equal(t, codes.Unauthenticated, st.Code(), "%v", err)
	require.Equal(t, message, st.Message())
}

func TestAuthInterceptorKeys(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	st := store.New(s.Pool).WithLastUsed(time.Hour)

	app, err := callAuth(t, st, "Bearer "+dbtest.TestAPIKey)
	require.NoError(t, err, "the catalog's chosen key")
	require.Equal(t, dbtest.TestApp, app)

	a, tokA, err := st.CreateKey(ctx, store.NewKey{ApplicationID: dbtest.TestApp})
	require.NoError(t, err)
	_, tokB, err := st.CreateKey(ctx, store.NewKey{ApplicationID: dbtest.TestApp})
	require.NoError(t, err)
	for _, tok := range []string{tokA, tokB} {
		app, err := callAuth(t, st, "Bearer "+tok)
		require.NoError(t, err)
		require.Equal(t, dbtest.TestApp, app)
	}

	// The right key id with another secret (and a valid checksum: a forgery, not a typo).
	forged, err := apikey.Generate()
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `UPDATE api_keys SET hash = $1 WHERE id = $2`, apikey.Hash(forged.Token), a.ID)
	require.NoError(t, err)
	_, err = callAuth(t, st, "Bearer "+tokA)
	requireRefused(t, err, "unknown API key")
	_, err = s.Pool.Exec(ctx, `UPDATE api_keys SET hash = $1 WHERE id = $2`, apikey.Hash(tokA), a.ID)
	require.NoError(t, err)

	_, err = st.RevokeKey(ctx, dbtest.TestApp, a.ID, nil)
	require.NoError(t, err)
	_, err = callAuth(t, st, "Bearer "+tokA)
	requireRefused(t, err, "API key revoked")
	_, err = callAuth(t, st, "Bearer "+tokB)
	require.NoError(t, err, "the other key still works")

	_, err = s.Pool.Exec(ctx, `UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE source = 'catalog'`)
	require.NoError(t, err)
	_, err = callAuth(t, st, "Bearer "+dbtest.TestAPIKey)
	requireRefused(t, err, "API key expired")

	unknown, err := apikey.Generate()
	require.NoError(t, err)
	_, err = callAuth(t, st, "Bearer "+unknown.Token)
	requireRefused(t, err, "unknown API key")
	_, err = callAuth(t, st, "Bearer not-a-key-of-anyone")
	requireRefused(t, err, "unknown API key")
}

// A malformed key is refused by its form alone: the store here has no database to ask.
func TestAuthInterceptorRefusesMalformedKeysWithoutALookup(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	pool, err := db.Open(context.Background(), s.URL)
	require.NoError(t, err)
	pool.Close()
	st := store.New(pool)

	k, err := apikey.Generate()
	require.NoError(t, err)
	typo := []byte(k.Token)
	typo[20] ^= 1
	for _, auth := range []string{
		"Bearer " + string(typo),
		"Bearer " + k.Token[:apikey.Len-1],
	} {
		_, err := callAuth(t, st, auth)
		requireRefused(t, err, "malformed API key: its checksum does not match (copied incompletely?)")
	}
	for _, auth := range []string{"Bearer key\x00with-a-nul", "Bearer clé-non-ascii-0123456789", "Bearer tab\tkey"} {
		_, err := callAuth(t, st, auth)
		requireRefused(t, err, "malformed API key: only printable ASCII characters are allowed")
	}
	_, err = callAuth(t, st, "Bearer "+strings.Repeat("k", apikey.MaxTokenLen+1))
	requireRefused(t, err, "malformed API key: longer than 512 characters")
	// A well-formed key does reach the (closed) database: the refusals above did not.
	_, err = callAuth(t, st, "Bearer "+k.Token)
	require.Error(t, err)
	require.NotEqual(t, codes.Unauthenticated, grpcx.ToStatus(err).Code())
}
