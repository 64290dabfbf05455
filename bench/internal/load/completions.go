package load

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Completions hands completions reported by one party (a webhook receiver, a subscription) to the
// callers awaiting them, by key. A completion may be reported before its caller awaits it; a
// second report of one key (at-least-once delivery) is kept only until awaited or forgotten.
type Completions[K comparable] struct {
	mu      sync.Mutex
	waiting map[K]chan completion
	early   map[K]completion
}

type completion struct {
	at  time.Time
	err error
}

// NewCompletions returns an empty Completions.
func NewCompletions[K comparable]() *Completions[K] {
	return &Completions[K]{waiting: map[K]chan completion{}, early: map[K]completion{}}
}

// Done reports k completed at at (err: it completed wrongly, e.g. a signature did not verify).
func (c *Completions[K]) Done(k K, at time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.waiting[k]; ok {
		delete(c.waiting, k)
		ch <- completion{at: at, err: err}
		return
	}
	c.early[k] = completion{at: at, err: err}
}

// Await waits at most timeout for k's completion and returns when it was reported.
func (c *Completions[K]) Await(ctx context.Context, k K, timeout time.Duration) (time.Time, error) {
	ch := make(chan completion, 1)
	c.mu.Lock()
	if done, ok := c.early[k]; ok {
		delete(c.early, k)
		c.mu.Unlock()
		return done.at, done.err
	}
	c.waiting[k] = ch
	c.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case done := <-ch:
		return done.at, done.err
	case <-ctx.Done():
	case <-timer.C:
	}
	c.mu.Lock()
	delete(c.waiting, k)
	c.mu.Unlock()
	if ctx.Err() != nil {
		return time.Time{}, ctx.Err()
	}
	return time.Time{}, fmt.Errorf("%v: no completion within %s", k, timeout)
}
