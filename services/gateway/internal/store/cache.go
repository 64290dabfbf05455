package store

import (
	"sync"
	"time"
)

// cache keeps values found in Postgres for a short time, so that the accept path does not read
// an API key's application and a capability's settings on every call. Only found values are kept
// (an unknown key or capability is read again each time), and at most maxEntries of them; a change
// to the catalog or a revoked key takes effect within the time-to-live.
type cache[V any] struct {
	ttl     time.Duration
	mu      sync.RWMutex
	entries map[string]cacheEntry[V]
}

type cacheEntry[V any] struct {
	v       V
	expires time.Time
}

// maxEntries bounds a cache; past it the cache is emptied (the next reads refill it).
const maxEntries = 10000

func newCache[V any](ttl time.Duration) *cache[V] {
	return &cache[V]{ttl: ttl, entries: map[string]cacheEntry[V]{}}
}

func (c *cache[V]) get(key string) (V, bool) {
	var zero V
	if c == nil || c.ttl <= 0 {
		return zero, false
	}
	c.mu.RLock()
	e, ok := c.entries[key]
	c.mu.RUnlock()
	if !ok || time.Now().After(e.expires) {
		return zero, false
	}
	return e.v, true
}

func (c *cache[V]) put(key string, v V) {
	if c == nil || c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= maxEntries {
		clear(c.entries)
	}
	c.entries[key] = cacheEntry[V]{v: v, expires: time.Now().Add(c.ttl)}
}
