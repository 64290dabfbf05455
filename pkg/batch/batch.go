// Package batch coalesces concurrent requests into batches, so that a hot path pays for one
// statement and one commit per batch instead of per request, the way River's completer and
// Postgres's group commit do.
//
// Batching is "natural": a request that finds a free runner starts a batch at once, alone, so an
// idle service adds no latency; requests that arrive while the runners are busy queue up and go
// together in the next batch, up to MaxSize. The busier the service, the larger the batches. An
// optional Linger holds a small batch back a little longer, for paths where a round trip costs
// more than the wait.
//
// Each caller gets its own answer and its own error: the batch function returns one response and
// one error per request, in order, or a batch error that every caller of that batch receives.
package batch

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Func runs one batch. It returns one response per request, in order, and optionally one error
// per request (nil: every request succeeded). A non-nil err fails the whole batch: every caller
// receives it. Requests are never empty.
type Func[Req, Resp any] func(ctx context.Context, reqs []Req) (resps []Resp, errs []error, err error)

// Options tune a Batcher. The zero value is usable.
type Options struct {
	// Name says which batcher an error came from.
	Name string
	// MaxSize bounds a batch (default 64).
	MaxSize int
	// Concurrency is how many batches may run at once (default 1).
	Concurrency int
	// Linger, if positive, is how long a batch smaller than MaxSize may wait, from the arrival of
	// its first request, for others to join it before it runs (default 0: it runs at once when a
	// runner is free).
	Linger time.Duration
}

// Stats are a Batcher's counts since it was made.
type Stats struct {
	Batches int64 // batches run
	Items   int64 // requests run in them
	Largest int64 // the largest batch
}

// Batcher coalesces concurrent Do calls into batches run by its Func.
type Batcher[Req, Resp any] struct {
	fn   Func[Req, Resp]
	opts Options

	mu          sync.Mutex
	queue       []*call[Req, Resp]
	queuedSince time.Time // arrival of the oldest queued request
	running     int       // runners busy
	timer       bool      // a linger timer is pending

	batches, items, largest atomic.Int64
}

type call[Req, Resp any] struct {
	ctx       context.Context
	req       Req
	done      chan struct{}
	resp      Resp
	err       error
	abandoned bool // its caller left while it was queued (guarded by the Batcher's mu)
}

// New returns a Batcher running fn.
func New[Req, Resp any](fn Func[Req, Resp], opts Options) *Batcher[Req, Resp] {
	if opts.MaxSize <= 0 {
		opts.MaxSize = 64
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	opts.Name = cmp.Or(opts.Name, "batch")
	return &Batcher[Req, Resp]{fn: fn, opts: opts}
}

// Stats returns the counts so far.
func (b *Batcher[Req, Resp]) Stats() Stats {
	return Stats{Batches: b.batches.Load(), Items: b.items.Load(), Largest: b.largest.Load()}
}

// Queued is how many requests wait for a runner (those whose callers left included, until a
// batch is taken).
func (b *Batcher[Req, Resp]) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// Do runs req in a batch and returns its response and error. If ctx ends while req is still
// queued, req is not run and Do returns ctx's error. If ctx ends while req's batch runs, Do returns
// ctx's error at once; the batch goes on, so its work may still take effect — the same
// uncertainty as a statement whose caller gave up.
func (b *Batcher[Req, Resp]) Do(ctx context.Context, req Req) (Resp, error) {
	var zero Resp
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	c := &call[Req, Resp]{ctx: ctx, req: req, done: make(chan struct{})}
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.queuedSince = time.Now()
	}
	b.queue = append(b.queue, c)
	b.startLocked()
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.resp, c.err
	case <-ctx.Done():
		b.mu.Lock()
		c.abandoned = true // no effect if its batch has already taken it
		b.mu.Unlock()
		return zero, ctx.Err()
	}
}

// startLocked starts a runner if one is free and the queue is ready to go.
func (b *Batcher[Req, Resp]) startLocked() {
	if b.running >= b.opts.Concurrency || len(b.queue) == 0 {
		return
	}
	if wait := b.lingerLocked(); wait > 0 {
		if !b.timer {
			b.timer = true
			time.AfterFunc(wait, func() {
				b.mu.Lock()
				b.timer = false
				b.startLocked()
				b.mu.Unlock()
			})
		}
		return
	}
	calls := b.takeLocked()
	if len(calls) == 0 {
		return
	}
	b.running++
	go b.runner(calls)
}

// lingerLocked is how much longer the queued requests should wait for company.
func (b *Batcher[Req, Resp]) lingerLocked() time.Duration {
	if b.opts.Linger <= 0 || len(b.queue) >= b.opts.MaxSize {
		return 0
	}
	return b.opts.Linger - time.Since(b.queuedSince)
}

// takeLocked removes the next batch from the queue, dropping requests whose callers left.
func (b *Batcher[Req, Resp]) takeLocked() []*call[Req, Resp] {
	var calls []*call[Req, Resp]
	i := 0
	for ; i < len(b.queue) && len(calls) < b.opts.MaxSize; i++ {
		if c := b.queue[i]; !c.abandoned {
			calls = append(calls, c)
		}
	}
	rest := copy(b.queue, b.queue[i:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	if rest > 0 {
		b.queuedSince = time.Now()
	}
	return calls
}

// runner runs batches until the queue has none ready, then frees its slot.
func (b *Batcher[Req, Resp]) runner(calls []*call[Req, Resp]) {
	for {
		b.run(calls)
		b.mu.Lock()
		calls = nil
		if len(b.queue) > 0 && b.lingerLocked() <= 0 {
			calls = b.takeLocked()
		}
		if len(calls) == 0 {
			b.running--
			b.startLocked() // a lingering queue gets its timer
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
	}
}

func (b *Batcher[Req, Resp]) run(calls []*call[Req, Resp]) {
	n := int64(len(calls))
	b.batches.Add(1)
	b.items.Add(n)
	for {
		l := b.largest.Load()
		if n <= l || b.largest.CompareAndSwap(l, n) {
			break
		}
	}
	reqs := make([]Req, len(calls))
	for i, c := range calls {
		reqs[i] = c.req
	}
	ctx, cancel := batchContext(calls)
	resps, errs, err := b.call(ctx, reqs)
	cancel()
	switch {
	case err != nil:
	case len(resps) != len(reqs) || (errs != nil && len(errs) != len(reqs)):
		err = fmt.Errorf("%s: the batch function answered %d responses and %d errors for %d requests", b.opts.Name, len(resps), len(errs), len(reqs))
	}
	for i, c := range calls {
		if err != nil {
			c.err = err
		} else {
			c.resp = resps[i]
			if errs != nil {
				c.err = errs[i]
			}
		}
		close(c.done)
	}
}

// call runs the batch function, turning a panic into the batch's error: the callers are waiting
// on other goroutines, and a panic here would take the process down with them.
func (b *Batcher[Req, Resp]) call(ctx context.Context, reqs []Req) (resps []Resp, errs []error, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s: panic in the batch function: %v", b.opts.Name, p)
		}
	}()
	return b.fn(ctx, reqs)
}

// batchContext is the context a batch runs with: no one caller's cancellation stops the others'
// work, and it ends at the latest of the callers' deadlines (none if one of them has none). Its
// values are the first caller's (a logger, trace span, authenticated identity…).
func batchContext[Req, Resp any](calls []*call[Req, Resp]) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(calls[0].ctx))
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(calls[0].ctx), latest)
}
