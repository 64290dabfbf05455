package ratelimit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fixed is a limiter over fixed limits per application and a replica count the test sets, on a
// clock the test moves.
type fixed struct {
	mu       sync.Mutex
	limits   map[string]Limits
	replicas int
	now      time.Time
}

func newFixed(limits map[string]Limits) (*fixed, *Limiter) {
	f := &fixed{limits: limits, replicas: 1, now: time.Unix(1_700_000_000, 0)}
	l := New(func(_ context.Context, app string) (Limits, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.limits[app], nil
	}, func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.replicas
	})
	l.now = func() time.Time {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.now
	}
	return f, l
}

func (f *fixed) advance(d time.Duration) { f.mu.Lock(); f.now = f.now.Add(d); f.mu.Unlock() }
func (f *fixed) set(n int)               { f.mu.Lock(); f.replicas = n; f.mu.Unlock() }

// allowed counts the calls admitted out of n made at one instant.
func allowed(t *testing.T, l *Limiter, app string, k Kind, n int) (int, Decision) {
	t.Helper()
	var ok int
	var last Decision
	for range n {
		d, err := l.Allow(context.Background(), app, k)
		require.NoError(t, err)
		if d.Allowed {
			ok++
		} else {
			last = d
		}
	}
	return ok, last
}

var tenPerSecond = Limits{Invoke: Limit{PerSecond: 10, Burst: 3}, Read: Limit{PerSecond: 100, Burst: 5}}

func TestBurstThenRefusalWithTheDelayToTheNextToken(t *testing.T) {
	f, l := newFixed(map[string]Limits{"a": tenPerSecond})

	ok, refused := allowed(t, l, "a", Invoke, 10)
	require.Equal(t, 3, ok, "the burst is admitted at once, no more")
	require.False(t, refused.Allowed)
	require.Equal(t, 100*time.Millisecond, refused.RetryAfter, "at 10/s the next token comes in 100ms")
	require.Equal(t, tenPerSecond.Invoke, refused.Limit, "the refusal names the application's limit")

	f.advance(99 * time.Millisecond)
	d, err := l.Allow(context.Background(), "a", Invoke)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, time.Millisecond, d.RetryAfter, "refused calls take no token: the delay only shrinks")

	f.advance(time.Millisecond)
	ok, _ = allowed(t, l, "a", Invoke, 2)
	require.Equal(t, 1, ok, "one token after 100ms")

	f.advance(time.Hour)
	ok, _ = allowed(t, l, "a", Invoke, 10)
	require.Equal(t, 3, ok, "an idle bucket fills up to its burst, not beyond")
}

func TestBucketsArePerApplicationAndKind(t *testing.T) {
	_, l := newFixed(map[string]Limits{"a": tenPerSecond, "b": tenPerSecond})

	ok, _ := allowed(t, l, "a", Invoke, 10)
	require.Equal(t, 3, ok)
	ok, _ = allowed(t, l, "a", Read, 10)
	require.Equal(t, 5, ok, "a's invokes spent do not touch its reads")
	ok, _ = allowed(t, l, "b", Invoke, 10)
	require.Equal(t, 3, ok, "a's invokes spent do not touch b's")
}

func TestUnlimited(t *testing.T) {
	_, l := newFixed(map[string]Limits{"a": {Invoke: Limit{PerSecond: 0, Burst: 1}, Read: Limit{PerSecond: 1, Burst: 1}}})
	ok, _ := allowed(t, l, "a", Invoke, 1000)
	require.Equal(t, 1000, ok, "a rate of 0 is no limit")
	ok, _ = allowed(t, l, "a", Read, 3)
	require.Equal(t, 1, ok)
}

func TestReplicaShare(t *testing.T) {
	f, l := newFixed(map[string]Limits{"a": {Invoke: Limit{PerSecond: 10, Burst: 4}}})
	f.set(2)
	ok, d := allowed(t, l, "a", Invoke, 10)
	require.Equal(t, 2, ok, "two replicas: half the burst each")
	require.Equal(t, 200*time.Millisecond, d.RetryAfter, "and half the rate: 5/s")
	require.Equal(t, 10.0, d.Limit.PerSecond, "the refusal still names the whole limit")

	f.set(3)
	f.advance(time.Hour)
	ok, _ = allowed(t, l, "a", Invoke, 10)
	require.Equal(t, 2, ok, "a third replica: ceil(4/3) = 2 tokens at most")

	// A resize keeps the tokens the bucket holds (capped at the old burst): it fills to the new
	// burst at the new rate, so a replica's departure adds no burst at once.
	f.set(1)
	ok, d = allowed(t, l, "a", Invoke, 10)
	require.Zero(t, ok, "alone again: the bucket emptied above stays empty")
	require.Equal(t, 100*time.Millisecond, d.RetryAfter, "but the whole rate applies at once: 10/s")
	f.advance(time.Hour)
	ok, _ = allowed(t, l, "a", Invoke, 10)
	require.Equal(t, 4, ok, "then the whole burst")
}

func TestSmallLimitSharedStillAdmits(t *testing.T) {
	f, l := newFixed(map[string]Limits{"a": {Invoke: Limit{PerSecond: 1, Burst: 1}}})
	f.set(4)
	ok, d := allowed(t, l, "a", Invoke, 3)
	require.Equal(t, 1, ok, "a share's burst is at least one token")
	require.Equal(t, 4*time.Second, d.RetryAfter, "1/s over four replicas: 0.25/s here")
}

func TestLimitChangeResizesTheBucket(t *testing.T) {
	f, l := newFixed(map[string]Limits{"a": tenPerSecond})
	ok, _ := allowed(t, l, "a", Invoke, 10)
	require.Equal(t, 3, ok)

	f.mu.Lock()
	f.limits["a"] = Limits{Invoke: Limit{PerSecond: 1000, Burst: 50}}
	f.mu.Unlock()
	d, err := l.Allow(context.Background(), "a", Invoke)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, time.Millisecond, d.RetryAfter, "the new rate applies at once: a token in 1ms, not 100ms")
	require.Equal(t, 1000.0, d.Limit.PerSecond)
	f.advance(time.Second)
	ok, _ = allowed(t, l, "a", Invoke, 100)
	require.Equal(t, 50, ok, "the new burst applies once the bucket refills")
}

func TestLimitsReadErrorIsReturned(t *testing.T) {
	boom := errors.New("database unreachable")
	l := New(func(context.Context, string) (Limits, error) { return Limits{}, boom }, func() int { return 1 })
	_, err := l.Allow(context.Background(), "a", Invoke)
	require.ErrorIs(t, err, boom)
}

func TestConcurrentCallsNeverExceedTheBurst(t *testing.T) {
	_, l := newFixed(map[string]Limits{"a": {Invoke: Limit{PerSecond: 1, Burst: 100}}})
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 8 {
		wg.Go(func() {
			ok, _ := allowed(t, l, "a", Invoke, 50)
			mu.Lock()
			total += ok
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Equal(t, 100, total, "400 calls at one instant: exactly the burst admitted")
}

// BenchmarkAllow is the limiter's cost on every accepted call: the limits' cached read is the
// caller's (Source), so this is the bucket's lookup and its token, over many applications.
func BenchmarkAllow(b *testing.B) {
	limits := Limits{Invoke: Limit{PerSecond: 1e9, Burst: 1e6}}
	l := New(func(context.Context, string) (Limits, error) { return limits, nil }, func() int { return 2 })
	apps := []string{"app-0", "app-1", "app-2", "app-3", "app-4", "app-5", "app-6", "app-7"}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if d, _ := l.Allow(ctx, apps[i%len(apps)], Invoke); !d.Allowed {
				b.Fatal("refused")
			}
			i++
		}
	})
}
