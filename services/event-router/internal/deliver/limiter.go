package deliver

import (
	"context"
	"sync"
	"time"
)

// limiter bounds the deliveries in flight per application. A caller over the bound waits at most
// its patience for a slot — long enough for a busy but healthy consumer's deliveries, which take
// milliseconds, to free one; far shorter than a hanging consumer holds its slots (the delivery
// timeout) — and is then told no, and defers its notice. So a burst of one application's events is
// delivered without a round trip through a delay level, and a hanging consumer parks a worker for
// at most the patience per notice.
type limiter struct {
	mu       sync.Mutex
	max      int
	patience time.Duration
	slots    map[string]chan struct{} // one semaphore per application; never removed (a few bytes each)
}

func newLimiter(n int, patience time.Duration) *limiter {
	return &limiter{max: n, patience: patience, slots: map[string]chan struct{}{}}
}

func (l *limiter) sem(app string) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.slots[app]
	if !ok {
		s = make(chan struct{}, l.max)
		l.slots[app] = s
	}
	return s
}

// acquire takes a slot of app, waiting at most the patience; it reports false if none was free.
func (l *limiter) acquire(ctx context.Context, app string) bool {
	s := l.sem(app)
	select {
	case s <- struct{}{}:
		return true
	default:
	}
	if l.patience <= 0 {
		return false
	}
	t := time.NewTimer(l.patience)
	defer t.Stop()
	select {
	case s <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// release gives a slot of app back.
func (l *limiter) release(app string) { <-l.sem(app) }
