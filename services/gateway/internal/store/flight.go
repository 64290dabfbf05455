package store

import (
	"context"
	"time"
)

// flightTimeout bounds a coalesced read: it runs on a context of its own (see coalesce), so that
// one caller giving up does not fail the others waiting on it.
const flightTimeout = 5 * time.Second

// coalesce runs read once for all the callers asking for key at the same time, and answers each
// when it is done or when its own ctx ends. Without it an entry expiring under load sent every
// call in flight to Postgres at once — a flood's calls for one key then held the whole pool, and
// every other application's accepts queued behind them (issue 11's flood bench).
func (s *Store) coalesce(ctx context.Context, key string, read func(context.Context) (any, error)) (any, error) {
	ch := s.flights.DoChan(key, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flightTimeout)
		defer cancel()
		return read(ctx)
	})
	select {
	case r := <-ch:
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// refreshAhead starts a read of key in the background (joining one in flight) when an entry read
// at read is in the last quarter of its time in the cache, so that a key or capability in steady
// use is read again before it expires and no call waits on the read. The entry a caller has is
// never older than the cache's TTL, so a revocation still takes effect within it.
func (s *Store) refreshAhead(key string, read time.Time, fetch func(context.Context) (any, error)) {
	if s.ttl <= 0 || time.Since(read) < s.ttl-s.ttl/4 {
		return
	}
	s.flights.DoChan(key, func() (any, error) { // DoChan runs it on a goroutine of its own
		ctx, cancel := context.WithTimeout(context.Background(), flightTimeout)
		defer cancel()
		return fetch(ctx)
	})
}
