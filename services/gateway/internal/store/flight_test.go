package store

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/secret"
)

// A key not in the cache, asked for by many calls at once, is read from Postgres once: the
// others wait on that read instead of each taking a pool connection.
func TestConcurrentMissesOfOneKeyShareOneRead(t *testing.T) {
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool).WithCache(time.Hour)
	held := holdRead(st, 1)
	reads, inRead, release := &held.reads, held.inRead, held.release
	hash := secret.Hash(dbtest.TestAPIKey)
	var wg sync.WaitGroup
	lookup := func() {
		k, err := st.KeyForChosen(context.Background(), hash)
		if err == nil && k.ApplicationID != dbtest.TestApp {
			t.Errorf("key of %q, want %q", k.ApplicationID, dbtest.TestApp)
		}
		if err != nil {
			t.Error(err)
		}
	}
	wg.Go(lookup)
	<-inRead // the first read is in flight and held
	for range 32 {
		wg.Go(lookup)
	}
	// Give the other lookups time to reach Postgres, as they would without coalescing: there is
	// no event to await for a read that must not happen.
	time.Sleep(200 * time.Millisecond)
	require.EqualValues(t, 1, reads.Load(), "lookups read Postgres while one read of the same key was in flight")
	close(release)
	wg.Wait()
	require.EqualValues(t, 1, reads.Load())
}

// A caller whose context ends while it waits on another's read gets its context's error; the
// read goes on for the others and fills the cache.
func TestAWaiterGivingUpDoesNotFailTheRead(t *testing.T) {
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool).WithCache(time.Hour)
	held := holdRead(st, 1)
	reads, inRead, release := &held.reads, held.inRead, held.release
	hash := secret.Hash(dbtest.TestAPIKey)
	first, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := st.KeyForChosen(first, hash)
		errc <- err
	}()
	<-inRead
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled, "the caller that gave up is answered at once")
	close(release)
	// The read, on a context of its own, completes and caches the key.
	require.Eventually(t, func() bool {
		_, ok := st.keys.Get("hash:" + string(hash))
		return ok
	}, 5*time.Second, 10*time.Millisecond)
	k, err := st.KeyForChosen(context.Background(), hash)
	require.NoError(t, err)
	require.Equal(t, dbtest.TestApp, k.ApplicationID)
	require.EqualValues(t, 1, reads.Load(), "the second lookup is a cache hit")
}

// A key in use is read again in the background before its entry expires: no call waits on that
// read, and the entry never lapses while the key is used.
func TestAKeyInUseIsRefreshedAheadOfItsExpiry(t *testing.T) {
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	// The refresh window is the TTL's last quarter: 1.5 s for the loop below to look up in, so that
	// a loaded machine's scheduling delays (hundreds of ms) cannot skip it and let the entry lapse.
	const ttl = 6 * time.Second
	st := New(s.Pool).WithCache(ttl)
	held := holdRead(st, 2) // the refresh: held until the test has looked up meanwhile
	reads, inRefresh, release := &held.reads, held.inRead, held.release
	hash := secret.Hash(dbtest.TestAPIKey)
	ctx := context.Background()
	_, err := st.KeyForChosen(ctx, hash)
	require.NoError(t, err)
	first := time.Now()
	// Use the key until its entry is in the last quarter of its TTL and a refresh starts.
	for refreshing := false; !refreshing; {
		select {
		case <-inRefresh:
			refreshing = true
		case <-time.After(10 * time.Millisecond): // the cache's clock must advance
			require.Less(t, time.Since(first), ttl, "no refresh began before the entry expired")
			_, err := st.KeyForChosen(ctx, hash)
			require.NoError(t, err)
		}
	}
	// While the refresh is held, lookups answer from the entry at once.
	done := make(chan error, 1)
	go func() {
		_, err := st.KeyForChosen(ctx, hash)
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second): // the refresh is held until the test releases it
		t.Fatal("a lookup waited on the refresh")
	}
	close(release)
	// Once the refresh has stored its record, the key is a hit past the first entry's expiry.
	require.Eventually(t, func() bool {
		k, ok := st.keys.Get("hash:" + string(hash))
		return ok && k.read.After(first)
	}, 5*time.Second, 10*time.Millisecond)
	for time.Since(first) < ttl+50*time.Millisecond {
		time.Sleep(10 * time.Millisecond) // past the first entry's expiry
	}
	before := reads.Load()
	_, err = st.KeyForChosen(ctx, hash)
	require.NoError(t, err)
	require.Equal(t, before, reads.Load(), "the refreshed entry answered without a read")
}

// heldRead makes st's n-th key read (counting from 1) wait, after reading, until release is
// closed; inRead is closed when it starts waiting. reads counts every read.
type heldRead struct {
	reads           atomic.Int32
	inRead, release chan struct{}
}

func holdRead(st *Store, n int32) *heldRead {
	h := &heldRead{inRead: make(chan struct{}), release: make(chan struct{})}
	st.afterKeyRead = func() {
		if h.reads.Add(1) == n {
			close(h.inRead)
			<-h.release
		}
	}
	return h
}
