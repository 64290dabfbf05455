package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/secret"
)

func TestCacheKeepsFoundValuesForItsTTL(t *testing.T) {
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	cached := New(s.Pool).WithCache(time.Hour)
	fresh := New(s.Pool)

	c, err := cached.CapabilityGet(ctx, dbtest.TestCapability)
	require.NoError(t, err)
	require.EqualValues(t, dbtest.TestMaxAttempts, c.MaxAttempts)
	k, err := cached.KeyForChosen(ctx, secret.Hash(dbtest.TestAPIKey))
	require.NoError(t, err)
	require.Equal(t, dbtest.TestApp, k.ApplicationID)

	_, err = s.Pool.Exec(ctx, `UPDATE capabilities SET max_attempts = 7`)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `UPDATE api_keys SET hash = $1`, secret.Hash("another-key"))
	require.NoError(t, err)

	c, err = cached.CapabilityGet(ctx, dbtest.TestCapability)
	require.NoError(t, err)
	require.EqualValues(t, dbtest.TestMaxAttempts, c.MaxAttempts, "within the TTL the cached capability answers")
	k, err = cached.KeyForChosen(ctx, secret.Hash(dbtest.TestAPIKey))
	require.NoError(t, err, "within the TTL the cached key answers")
	require.Equal(t, dbtest.TestApp, k.ApplicationID)

	c, err = fresh.CapabilityGet(ctx, dbtest.TestCapability)
	require.NoError(t, err)
	require.EqualValues(t, 7, c.MaxAttempts, "without a cache every call reads Postgres")
	_, err = fresh.KeyForChosen(ctx, secret.Hash(dbtest.TestAPIKey))
	require.ErrorIs(t, err, ErrNotFound, "without a cache a revoked key is refused at once")
}

func TestCacheForgetsExpiredAndNeverKeepsMisses(t *testing.T) {
	s := dbtest.NewSchema(t)
	ctx := context.Background()
	st := New(s.Pool).WithCache(time.Hour)

	_, err := st.CapabilityGet(ctx, dbtest.TestCapability)
	require.ErrorIs(t, err, ErrNotFound)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	_, err = st.CapabilityGet(ctx, dbtest.TestCapability)
	require.NoError(t, err, "a miss is not cached: the capability is found once the catalog has it")

	short := New(s.Pool).WithCache(50 * time.Millisecond)
	c, err := short.CapabilityGet(ctx, dbtest.TestCapability)
	require.NoError(t, err)
	require.EqualValues(t, dbtest.TestMaxAttempts, c.MaxAttempts)
	_, err = s.Pool.Exec(ctx, `UPDATE capabilities SET max_attempts = 7`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c, err := short.CapabilityGet(ctx, dbtest.TestCapability)
		return err == nil && c.MaxAttempts == 7
	}, 10*time.Second, 10*time.Millisecond, "an expired entry is not used")

	off := New(s.Pool).WithCache(0)
	_, err = off.CapabilityGet(ctx, dbtest.TestCapability)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `UPDATE capabilities SET max_attempts = 8`)
	require.NoError(t, err)
	c, err = off.CapabilityGet(ctx, dbtest.TestCapability)
	require.NoError(t, err)
	require.EqualValues(t, 8, c.MaxAttempts, "a zero TTL keeps nothing")
}
