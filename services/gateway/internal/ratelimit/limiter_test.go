package ratelimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Allow is Take with nothing reserved: a token now, or when to come back.
func (l *Limiter) Allow(ctx context.Context, app string, k Kind) (Decision, error) {
	return l.Take(ctx, app, k, 0)
}

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

// A call whose clock reading is older than the last one's (read before it got the lock, on a
// busy machine) must not earn the interval between the two again: with the clock never past
// T+100ms, a 10/s bucket of burst 1 admits its burst and one token, however the readings
// interleave.
func TestClockReadingsOutOfOrderEarnNothing(t *testing.T) {
	limits := Limits{Invoke: Limit{PerSecond: 10, Burst: 1}}
	l := New(func(context.Context, string) (Limits, error) { return limits, nil }, func() int { return 1 })
	T := time.Unix(1_700_000_000, 0)
	i := 0
	l.now = func() time.Time {
		i++
		if i%2 == 0 {
			return T.Add(50 * time.Millisecond)
		}
		return T.Add(100 * time.Millisecond)
	}
	ok, _ := allowed(t, l, "a", Invoke, 1000)
	require.Equal(t, 1, ok, "the burst at T+100ms, then nothing: time never ran past it")
}

// Many goroutines on one bucket, on the real clock: no more than the rate over the time plus the
// burst is admitted, and no refusal advises more than the time to one token.
func TestConcurrentFloodAdmitsTheLimit(t *testing.T) {
	const perSecond, burst = 50.0, 50
	limits := Limits{Invoke: Limit{PerSecond: perSecond, Burst: burst}}
	l := New(func(context.Context, string) (Limits, error) { return limits, nil }, func() int { return 1 })
	var admitted, refused, maxRetry atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for time.Since(start) < 2*time.Second {
				d, err := l.Allow(context.Background(), "a", Invoke)
				if err != nil {
					panic(err)
				}
				if d.Allowed {
					admitted.Add(1)
					continue
				}
				refused.Add(1)
				for r := int64(d.RetryAfter); r > maxRetry.Load(); {
					if maxRetry.CompareAndSwap(maxRetry.Load(), r) {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	t.Logf("admitted %d, refused %d in %.2fs; max RetryAfter %v", admitted.Load(), refused.Load(), elapsed, time.Duration(maxRetry.Load()))
	require.Positive(t, refused.Load(), "the flood went past the limit")
	require.LessOrEqual(t, float64(admitted.Load()), perSecond*elapsed+burst+2, "at most rate × time + burst")
	require.GreaterOrEqual(t, float64(admitted.Load()), perSecond*(elapsed-0.2)+burst, "and about that many")
	require.LessOrEqual(t, time.Duration(maxRetry.Load()), time.Second/perSecond+time.Millisecond,
		"a refusal takes nothing: the delay never grows past one token's")
}

// Take reserves a token that comes within its bound: the calls admitted to wait are spaced one
// token apart and bounded by rate × within; the next one is refused with the delay past them.
func TestTakeReservesTheTokensWithin(t *testing.T) {
	_, l := newFixed(map[string]Limits{"a": {Invoke: Limit{PerSecond: 100, Burst: 1}}})
	d, err := l.Take(context.Background(), "a", Invoke, 50*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, Decision{Allowed: true, Limit: d.Limit}, d, "the burst: at once")
	for i := 1; i <= 5; i++ {
		d, err = l.Take(context.Background(), "a", Invoke, 50*time.Millisecond)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, time.Duration(i)*10*time.Millisecond, d.Wait, "the i-th token in the queue, 10ms apart")
	}
	d, err = l.Take(context.Background(), "a", Invoke, 50*time.Millisecond)
	require.NoError(t, err)
	require.False(t, d.Allowed, "rate × within = 5 reserved at most")
	require.Equal(t, 60*time.Millisecond, d.RetryAfter, "the refusal's delay counts the tokens reserved")
	d, err = l.Allow(context.Background(), "a", Invoke)
	require.NoError(t, err)
	require.False(t, d.Allowed, "Allow reserves nothing")
}

func TestPeekTakesNothing(t *testing.T) {
	f, l := newFixed(map[string]Limits{"a": {Invoke: Limit{PerSecond: 10, Burst: 1}}})
	ctx := context.Background()
	for range 5 {
		d, err := l.Peek(ctx, "a", Invoke, 0)
		require.NoError(t, err)
		require.True(t, d.Allowed, "the burst's token is there, however often Peek looks")
	}
	d, err := l.Take(ctx, "a", Invoke, 0)
	require.NoError(t, err)
	require.True(t, d.Allowed, "Peek left the token for Take")
	d, err = l.Peek(ctx, "a", Invoke, 0)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, 100*time.Millisecond, d.RetryAfter)
	d, err = l.Peek(ctx, "a", Invoke, 100*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, Decision{Allowed: true, Wait: 100 * time.Millisecond, Limit: d.Limit}, d, "a token within: Peek says Take would wait for it")
	d, err = l.Peek(ctx, "a", Invoke, 100*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 100*time.Millisecond, d.Wait, "and reserved nothing")
	f.mu.Lock()
	f.now = f.now.Add(100 * time.Millisecond)
	f.mu.Unlock()
	d, err = l.Take(ctx, "a", Invoke, 0)
	require.NoError(t, err)
	require.True(t, d.Allowed, "the refill Peek saw is Take's")
}

func TestRetryAfterIsCapped(t *testing.T) {
	_, l := newFixed(map[string]Limits{"a": {Invoke: Limit{PerSecond: 1e-6, Burst: 1}}})
	ok, d := allowed(t, l, "a", Invoke, 2)
	require.Equal(t, 1, ok)
	require.Equal(t, MaxRetryAfter, d.RetryAfter, "a token 11 days away is advised as an hour")
}

// Buckets full (idle for the time to refill) are dropped at the next sweep; one still filling
// is kept, with its tokens.
func TestIdleBucketsAreSwept(t *testing.T) {
	f, l := newFixed(map[string]Limits{"idle": tenPerSecond, "busy": {Invoke: Limit{PerSecond: 0.01, Burst: 1}}})
	allowed(t, l, "idle", Invoke, 1)
	allowed(t, l, "busy", Invoke, 1)
	f.advance(sweepEvery)
	allowed(t, l, "idle", Read, 1) // a new bucket's lookup sweeps
	l.buckets.mu.RLock()
	_, idle := l.buckets.m[bucketKey{"idle", Invoke}]
	_, busy := l.buckets.m[bucketKey{"busy", Invoke}]
	l.buckets.mu.RUnlock()
	require.False(t, idle, "refilled a minute after its last call: dropped")
	require.True(t, busy, "at 0.01/s still filling: kept")
	ok, _ := allowed(t, l, "busy", Invoke, 1)
	require.Zero(t, ok, "and its spent token was not given back")
	ok, _ = allowed(t, l, "idle", Invoke, 10)
	require.Equal(t, 3, ok, "a dropped bucket comes back full, as it was")
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
