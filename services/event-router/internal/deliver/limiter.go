package deliver

import "sync"

// limiter bounds the deliveries in flight per application. It never waits: a caller over the
// bound is told so and defers its notice, so no worker is parked behind one application.
type limiter struct {
	mu       sync.Mutex
	max      int
	inFlight map[string]int
}

func newLimiter(n int) *limiter { return &limiter{max: n, inFlight: map[string]int{}} }

// acquire takes a slot of app, reporting false if all are taken.
func (l *limiter) acquire(app string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight[app] >= l.max {
		return false
	}
	l.inFlight[app]++
	return true
}

// release gives a slot of app back.
func (l *limiter) release(app string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight[app]--; l.inFlight[app] <= 0 {
		delete(l.inFlight, app)
	}
}
