package ratelimit

import (
	"sync"
	"time"
)

// table holds token buckets by key, each made on its first use. A bucket that is full — idle for
// at least the time it takes to refill — is dropped by a sweep that runs when a bucket is made,
// at most every sweepEvery: a new bucket starts full, so dropping it changes nothing but the
// memory held by keys no longer used. The per-application limits (Limiter) and the failed
// authentications (Failures) keep their buckets in one.
type table[K comparable] struct {
	mu        sync.RWMutex
	m         map[K]*bucket
	lastSweep time.Time
}

func newTable[K comparable]() table[K] { return table[K]{m: map[K]*bucket{}} }

// lookup returns the bucket of key, or nil if it has none.
func (t *table[K]) lookup(key K) *bucket {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.m[key]
}

// get returns the bucket of key, made if new, sweeping full buckets every sweepEvery of now.
func (t *table[K]) get(key K, now func() time.Time) *bucket {
	if b := t.lookup(key); b != nil {
		return b
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if at := now(); at.Sub(t.lastSweep) >= sweepEvery {
		t.sweep(at)
		t.lastSweep = at
	}
	b := t.m[key]
	if b == nil {
		b = &bucket{}
		t.m[key] = b
	}
	return b
}

// sweep drops the buckets full at now; t.mu is held. A bucket just made, whose first call has
// not yet taken its lock, is left alone.
func (t *table[K]) sweep(now time.Time) {
	for key, b := range t.m {
		b.mu.Lock()
		if b.last.IsZero() {
			b.mu.Unlock()
			continue
		}
		if b.advance(now); b.tokens >= b.burst {
			b.dropped = true
			delete(t.m, key)
		}
		b.mu.Unlock()
	}
}
