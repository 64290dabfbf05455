// Package load drives workloads and records each call's latency: closed loop (Run: C callers, each
// calling again as soon as its previous call answered) and open loop (RunOpen: arrivals at a fixed
// rate whether or not earlier calls answered — closed loops hide queueing).
package load

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Op is one call. worker is the caller's index (0..Callers-1), seq the call's number across all
// callers (0-based).
type Op func(ctx context.Context, worker int, seq int64) error

// Params is one closed-loop run.
type Params struct {
	Callers int
	// N calls in all when positive; otherwise calls until Duration has passed.
	N        int
	Duration time.Duration
}

// Result is the outcome of a run.
type Result struct {
	Requests int           // calls that answered without error
	Errors   int           // calls that failed
	FirstErr error         // the first failure, for the report
	Elapsed  time.Duration // first call sent → last call answered
	P50, P99 time.Duration // latency of the successful calls
	Max      time.Duration
	// Latencies are the successful calls' latencies, sorted, for percentiles over
	// several runs pooled.
	Latencies []time.Duration
}

// Rate is successful calls per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Run runs op closed-loop. It stops early, returning what was measured, when ctx ends, or after
// maxErrors failures (0: never).
func Run(ctx context.Context, p Params, maxErrors int, op Op) Result {
	if p.Callers < 1 {
		p.Callers = 1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var deadline time.Time
	var next atomic.Int64
	var errCount atomic.Int64
	var firstErr atomic.Value
	lats := make([][]time.Duration, p.Callers)
	var wg sync.WaitGroup
	start := time.Now()
	if p.N <= 0 {
		deadline = start.Add(p.Duration)
	}
	var last atomic.Int64 // UnixNano of the last answer
	for w := range p.Callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, 1024)
			for ctx.Err() == nil {
				seq := next.Add(1) - 1
				if p.N > 0 && seq >= int64(p.N) {
					break
				}
				t0 := time.Now()
				if !deadline.IsZero() && t0.After(deadline) {
					break
				}
				err := op(ctx, w, seq)
				t1 := time.Now()
				for {
					l := last.Load()
					if t1.UnixNano() <= l || last.CompareAndSwap(l, t1.UnixNano()) {
						break
					}
				}
				if err != nil {
					if ctx.Err() != nil {
						break // interrupted: not the operation's failure
					}
					firstErr.CompareAndSwap(nil, errBox{err})
					if n := errCount.Add(1); maxErrors > 0 && n >= int64(maxErrors) {
						cancel()
					}
					continue
				}
				mine = append(mine, t1.Sub(t0))
			}
			lats[w] = mine
		}()
	}
	wg.Wait()
	r := Result{Errors: int(errCount.Load())}
	if b, ok := firstErr.Load().(errBox); ok {
		r.FirstErr = b.err
	}
	if l := last.Load(); l > 0 {
		r.Elapsed = time.Unix(0, l).Sub(start)
	}
	all := slices.Concat(lats...)
	r.Requests = len(all)
	if len(all) > 0 {
		slices.Sort(all)
		r.P50, r.P99, r.Max = Percentile(all, 50), Percentile(all, 99), all[len(all)-1]
	}
	return r
}

type errBox struct{ err error }

// Percentile of sorted durations (nearest rank below).
func Percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[(len(sorted)-1)*p/100]
}

// Summary is the median of repeated runs.
type Summary struct {
	Runs     []Result
	Median   Result  // the run with the median rate; its P50/P99 are the medians of the runs'
	Min, Max float64 // lowest and highest rate among the runs
	Errors   int     // failures over all runs
	FirstErr error
}

// Summarize takes the run with the median rate (the lower middle one for an even count).
func Summarize(runs []Result) Summary {
	var s Summary
	for _, r := range runs {
		s.Errors += r.Errors
		if s.FirstErr == nil {
			s.FirstErr = r.FirstErr
		}
	}
	if len(runs) == 0 {
		return s
	}
	s.Runs = runs
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b Result) int {
		switch ra, rb := a.Rate(), b.Rate(); {
		case ra < rb:
			return -1
		case ra > rb:
			return 1
		}
		return 0
	})
	s.Median = sorted[(len(sorted)-1)/2]
	s.Min, s.Max = sorted[0].Rate(), sorted[len(sorted)-1].Rate()
	s.Median.P50 = MedianOf(runs, func(r Result) time.Duration { return r.P50 })
	s.Median.P99 = MedianOf(runs, func(r Result) time.Duration { return r.P99 })
	return s
}

// MedianOf is the median (the lower middle one for an even count) of a duration taken from each
// of items; 0 for none.
func MedianOf[T any](items []T, d func(T) time.Duration) time.Duration {
	if len(items) == 0 {
		return 0
	}
	ds := make([]time.Duration, len(items))
	for i, it := range items {
		ds[i] = d(it)
	}
	slices.Sort(ds)
	return ds[(len(ds)-1)/2]
}

// ErrNoCalls is returned by Check for a run in which no call succeeded.
var ErrNoCalls = errors.New("no call succeeded")

// Check returns an error describing the failures of a run, if any.
func (r Result) Check() error {
	switch {
	case r.Errors > 0:
		return fmt.Errorf("%d of %d calls failed, first: %w", r.Errors, r.Errors+r.Requests, r.FirstErr)
	case r.Requests == 0:
		return ErrNoCalls
	}
	return nil
}

// OpenParams is one open-loop run: arrivals at a fixed Rate for Duration (or N arrivals), each
// call started on its schedule whether or not earlier calls have answered, so that queueing in
// the system under test shows in the latencies instead of slowing the arrivals down.
type OpenParams struct {
	Rate     float64 // arrivals per second
	N        int     // arrivals in all when positive; otherwise Rate × Duration
	Duration time.Duration
	// MaxInFlight bounds the calls not yet answered (0: 10 000); an arrival finding the bound
	// reached counts as an error ("overloaded") rather than waiting, which would close the loop.
	MaxInFlight int
}

// ErrOverloaded is the failure of an open-loop arrival that found MaxInFlight calls unanswered.
var ErrOverloaded = errors.New("overloaded: too many calls in flight")

// recorder collects the outcomes of calls that end on goroutines of their own.
type recorder struct {
	mu       sync.Mutex
	start    time.Time
	lats     []time.Duration
	errCount int
	firstErr error
	last     time.Time
	onError  func(count int) // called with the failures so far, under the lock (nil: none)
}

// record notes a call that ended at end, after lat, with err.
func (r *recorder) record(lat time.Duration, end time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if end.After(r.last) {
		r.last = end
	}
	if err != nil {
		r.errCount++
		if r.firstErr == nil {
			r.firstErr = err
		}
		if r.onError != nil {
			r.onError(r.errCount)
		}
		return
	}
	r.lats = append(r.lats, lat)
}

// result summarizes what was recorded; call it when no call is running any more.
func (r *recorder) result() Result {
	res := Result{Errors: r.errCount, FirstErr: r.firstErr, Requests: len(r.lats)}
	if !r.last.IsZero() {
		res.Elapsed = r.last.Sub(r.start)
	}
	if len(r.lats) > 0 {
		slices.Sort(r.lats)
		res.P50, res.P99, res.Max = Percentile(r.lats, 50), Percentile(r.lats, 99), r.lats[len(r.lats)-1]
		res.Latencies = r.lats
	}
	return res
}

// RunOpen runs op open-loop. Each call's latency is measured from its scheduled arrival time, not
// from when its goroutine got to run, so a lagging generator cannot hide latency (coordinated
// omission). It returns when every started call has answered or ctx ends.
func RunOpen(ctx context.Context, p OpenParams, op Op) Result {
	n := p.N
	if n <= 0 {
		n = int(p.Rate * p.Duration.Seconds())
	}
	limit := p.MaxInFlight
	if limit <= 0 {
		limit = 10000
	}
	interval := time.Duration(float64(time.Second) / p.Rate)
	var (
		wg       sync.WaitGroup
		inFlight atomic.Int64
	)
	rec := &recorder{start: time.Now(), lats: make([]time.Duration, 0, n)}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := range n {
		due := rec.start.Add(time.Duration(i) * interval)
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		if inFlight.Load() >= int64(limit) {
			rec.record(0, time.Now(), ErrOverloaded)
			continue
		}
		inFlight.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer inFlight.Add(-1)
			err := op(ctx, 0, int64(i))
			end := time.Now()
			if err != nil && ctx.Err() != nil {
				return // interrupted: not the operation's failure
			}
			rec.record(end.Sub(due), end, err)
		}()
	}
	wg.Wait()
	return rec.result()
}

// Submit starts one call and returns at once with the function that waits for its completion
// (the accept of an execution, and the wait for its webhook).
type Submit func(ctx context.Context, worker int, seq int64) (wait func() error, err error)

// OpOf is the whole call of a submit: submit, then wait for the completion.
func OpOf(submit Submit) Op {
	return func(ctx context.Context, w int, seq int64) error {
		wait, err := submit(ctx, w, seq)
		if err != nil {
			return err
		}
		return wait()
	}
}

// RunPipelined runs p.Callers submitters closed loop on the submit alone — each submits again as
// soon as its previous submit answered, without waiting for completions — until p.N calls are
// submitted, and waits for every completion. Latency is submit → completion; Elapsed is the first
// submit → the last completion, so Rate is the completion throughput with as much work in flight
// as the submitters can put there.
func RunPipelined(ctx context.Context, p Params, maxErrors int, submit Submit) Result {
	if p.Callers < 1 {
		p.Callers = 1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next             atomic.Int64
		waiters, callers sync.WaitGroup
	)
	rec := &recorder{start: time.Now(), lats: make([]time.Duration, 0, max(p.N, 0))}
	if maxErrors > 0 {
		rec.onError = func(count int) {
			if count >= maxErrors {
				cancel()
			}
		}
	}
	record := func(t0 time.Time, err error) {
		if err != nil && ctx.Err() != nil {
			return // interrupted: not the call's failure
		}
		t1 := time.Now()
		rec.record(t1.Sub(t0), t1, err)
	}
	var deadline time.Time
	if p.N <= 0 {
		deadline = rec.start.Add(p.Duration)
	}
	for w := range p.Callers {
		callers.Go(func() {
			for ctx.Err() == nil {
				seq := next.Add(1) - 1
				if p.N > 0 && seq >= int64(p.N) {
					return
				}
				t0 := time.Now()
				if !deadline.IsZero() && t0.After(deadline) {
					return
				}
				wait, err := submit(ctx, w, seq)
				if err != nil {
					record(t0, err)
					continue
				}
				waiters.Go(func() { record(t0, wait()) })
			}
		})
	}
	callers.Wait()
	waiters.Wait()
	return rec.result()
}
