package load

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRunPipelinedSubmitsWithoutWaitingForCompletions(t *testing.T) {
	const n = 50
	release := make(chan struct{})
	var submitted atomic.Int64
	submit := func(ctx context.Context, _ int, _ int64) (func() error, error) {
		if submitted.Add(1) == n {
			close(release) // completions may only happen once every call was submitted
		}
		return func() error { <-release; return nil }, nil
	}
	r := RunPipelined(context.Background(), Params{Callers: 4, N: n}, 0, submit)
	require.Equal(t, n, r.Requests)
	require.Zero(t, r.Errors)
	require.Positive(t, r.Elapsed)
	require.LessOrEqual(t, r.P50, r.P99)
	require.LessOrEqual(t, r.P99, r.Max)
}

func TestRunOpenKeepsArrivingWhileCallsAreInFlight(t *testing.T) {
	var inFlight, peak atomic.Int64
	gate := make(chan struct{})
	op := func(ctx context.Context, _ int, seq int64) error {
		now := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); now > p; p = peak.Load() {
			if peak.CompareAndSwap(p, now) {
				break
			}
		}
		if seq == 0 {
			<-gate // the first call answers only when the last has arrived
		}
		if seq == 9 {
			close(gate)
		}
		return nil
	}
	r := RunOpen(context.Background(), OpenParams{Rate: 1000, N: 10}, op)
	require.Equal(t, 10, r.Requests, "every arrival was made although the first call had not answered")
	require.GreaterOrEqual(t, peak.Load(), int64(2))
	require.GreaterOrEqual(t, r.Max, 9*time.Millisecond, "the first call's latency counts from its scheduled arrival until the last arrival released it")
}

func TestCompletionsHandsEachCompletionToItsCaller(t *testing.T) {
	c := NewCompletions[string]()
	ctx := context.Background()
	early := time.Unix(100, 0)
	c.Done("a", early, nil) // reported before anyone awaits it
	at, err := c.Await(ctx, "a", time.Minute)
	require.NoError(t, err)
	require.Equal(t, early, at)

	got := make(chan time.Time)
	go func() {
		at, err := c.Await(ctx, "b", time.Minute)
		require.NoError(t, err)
		got <- at
	}()
	later := time.Unix(200, 0)
	for {
		c.mu.Lock()
		_, waiting := c.waiting["b"]
		c.mu.Unlock()
		if waiting {
			break
		}
		runtime.Gosched()
	}
	c.Done("b", later, nil)
	require.Equal(t, later, <-got)

	_, err = c.Await(ctx, "never", time.Millisecond)
	require.ErrorContains(t, err, "never: no completion within 1ms")
	c.mu.Lock()
	require.Empty(t, c.waiting, "a caller that gave up leaves nothing behind")
	c.mu.Unlock()
}
