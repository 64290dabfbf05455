package batch_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/pkg/batch"
)

// gate is a batch function that reports each batch it is given and then waits to be released.
type gate struct {
	batches chan []int
	release chan struct{}
	running atomic.Int32
	peak    atomic.Int32
}

func newGate() *gate { return &gate{batches: make(chan []int, 100), release: make(chan struct{})} }

func (g *gate) fn(_ context.Context, reqs []int) ([]string, []error, error) {
	n := g.running.Add(1)
	defer g.running.Add(-1)
	for p := g.peak.Load(); n > p; p = g.peak.Load() {
		if g.peak.CompareAndSwap(p, n) {
			break
		}
	}
	g.batches <- append([]int(nil), reqs...)
	<-g.release
	resps := make([]string, len(reqs))
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		resps[i] = fmt.Sprint("r", r)
		if r < 0 {
			errs[i] = fmt.Errorf("negative %d", r)
		}
	}
	return resps, errs, nil
}

type answer struct {
	resp string
	err  error
}

func do(ctx context.Context, b *batch.Batcher[int, string], req int) chan answer {
	ch := make(chan answer, 1)
	go func() {
		r, err := b.Do(ctx, req)
		ch <- answer{r, err}
	}()
	return ch
}

// waitQueued waits until n requests wait for a runner.
func waitQueued(t *testing.T, b *batch.Batcher[int, string], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for b.Queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued after 5 s, want %d", b.Queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestIdleRequestRunsAloneAtOnce(t *testing.T) {
	g := newGate()
	b := batch.New(g.fn, batch.Options{})
	a := do(context.Background(), b, 1)
	if got := <-g.batches; len(got) != 1 || got[0] != 1 {
		t.Fatalf("first batch %v, want [1]", got)
	}
	close(g.release)
	if r := <-a; r.err != nil || r.resp != "r1" {
		t.Fatalf("answer %+v", r)
	}
}

func TestRequestsArrivingWhileBusyGoTogetherUpToMaxSize(t *testing.T) {
	g := newGate()
	b := batch.New(g.fn, batch.Options{MaxSize: 4})
	first := do(context.Background(), b, 0)
	<-g.batches // the runner is now busy
	var answers []chan answer
	for i := 1; i <= 6; i++ {
		answers = append(answers, do(context.Background(), b, i))
	}
	waitQueued(t, b, 6)
	close(g.release)
	<-first
	second, third := <-g.batches, <-g.batches
	if len(second) != 4 || len(third) != 2 {
		t.Fatalf("batches %v then %v, want 4 then 2", second, third)
	}
	for i, ch := range answers {
		if r := <-ch; r.err != nil || r.resp != fmt.Sprint("r", i+1) {
			t.Fatalf("answer %d: %+v", i+1, r)
		}
	}
	if s := b.Stats(); s.Batches != 3 || s.Items != 7 || s.Largest != 4 {
		t.Fatalf("stats %+v", s)
	}
}

func TestEachCallerGetsItsOwnError(t *testing.T) {
	g := newGate()
	close(g.release)
	b := batch.New(g.fn, batch.Options{})
	if _, err := b.Do(context.Background(), -3); err == nil || err.Error() != "negative -3" {
		t.Fatalf("error %v, want negative -3", err)
	}
	if r, err := b.Do(context.Background(), 3); err != nil || r != "r3" {
		t.Fatalf("answer %q, %v", r, err)
	}
}

func TestBatchErrorFailsEveryCallerOfThatBatch(t *testing.T) {
	boom := errors.New("connection lost")
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	var n atomic.Int32
	b := batch.New(func(_ context.Context, reqs []int) ([]string, []error, error) {
		started <- struct{}{}
		<-release
		if n.Add(1) == 2 {
			return nil, nil, boom
		}
		return make([]string, len(reqs)), nil, nil
	}, batch.Options{})
	first := do(context.Background(), b, 0)
	<-started
	second := []chan answer{do(context.Background(), b, 1), do(context.Background(), b, 2)}
	waitQueued(t, b, 2)
	close(release)
	if r := <-first; r.err != nil {
		t.Fatalf("first batch: %v", r.err)
	}
	for _, ch := range second {
		if r := <-ch; !errors.Is(r.err, boom) {
			t.Fatalf("second batch: %v, want %v", r.err, boom)
		}
	}
}

func TestWrongAnswerCountFailsTheBatch(t *testing.T) {
	b := batch.New(func(_ context.Context, reqs []int) ([]string, []error, error) {
		return nil, nil, nil
	}, batch.Options{Name: "short"})
	if _, err := b.Do(context.Background(), 1); err == nil {
		t.Fatal("a batch answering 0 responses for 1 request succeeded")
	}
}

func TestPanicBecomesTheBatchError(t *testing.T) {
	b := batch.New(func(context.Context, []int) ([]string, []error, error) { panic("bug") }, batch.Options{Name: "p"})
	if _, err := b.Do(context.Background(), 1); err == nil {
		t.Fatal("a panicking batch succeeded")
	}
	// The batcher still works after it.
	if s := b.Stats(); s.Batches != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCallerLeavingWhileQueuedIsNotRun(t *testing.T) {
	g := newGate()
	b := batch.New(g.fn, batch.Options{})
	first := do(context.Background(), b, 0)
	<-g.batches
	ctx, cancel := context.WithCancel(context.Background())
	left := do(ctx, b, 1)
	stays := do(context.Background(), b, 2)
	waitQueued(t, b, 2)
	cancel()
	if r := <-left; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("left caller: %v", r.err)
	}
	close(g.release)
	<-first
	if got := <-g.batches; len(got) != 1 || got[0] != 2 {
		t.Fatalf("next batch %v, want [2]: a caller that left was run", got)
	}
	if r := <-stays; r.err != nil {
		t.Fatal(r.err)
	}
}

func TestCallerLeavingWhileRunningReturnsAtOnce(t *testing.T) {
	g := newGate()
	b := batch.New(g.fn, batch.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	a := do(ctx, b, 1)
	<-g.batches
	cancel()
	if r := <-a; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("caller that left: %v", r.err)
	}
	close(g.release)
}

func TestBatchContextOutlivesOneCallerAndEndsAtTheLatestDeadline(t *testing.T) {
	type key struct{}
	got := make(chan context.Context, 2)
	release := make(chan struct{})
	b := batch.New(func(ctx context.Context, reqs []int) ([]string, []error, error) {
		got <- ctx
		<-release
		return make([]string, len(reqs)), nil, nil
	}, batch.Options{})
	first := do(context.Background(), b, 0)
	<-got
	near, cancelNear := context.WithTimeout(context.WithValue(context.Background(), key{}, "v"), time.Minute)
	defer cancelNear()
	far, cancelFar := context.WithTimeout(context.Background(), time.Hour)
	defer cancelFar()
	a := do(near, b, 1)
	waitQueued(t, b, 1) // a is the batch's first caller
	c := do(far, b, 2)
	waitQueued(t, b, 2)
	release <- struct{}{}
	<-first
	ctx := <-got
	cancelNear()
	if r := <-a; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", r.err)
	}
	if ctx.Err() != nil {
		t.Fatal("one caller's cancellation cancelled the batch")
	}
	d, ok := ctx.Deadline()
	fd, _ := far.Deadline()
	if !ok || !d.Equal(fd) {
		t.Fatalf("batch deadline %v (%v), want the latest caller's %v", d, ok, fd)
	}
	if v, _ := ctx.Value(key{}).(string); v != "v" {
		t.Fatalf("batch context value %q, want the first caller's", v)
	}
	close(release)
	if r := <-c; r.err != nil {
		t.Fatal(r.err)
	}
}

func TestConcurrencyBoundsRunningBatches(t *testing.T) {
	g := newGate()
	b := batch.New(g.fn, batch.Options{Concurrency: 2})
	a1, a2 := do(context.Background(), b, 1), do(context.Background(), b, 2)
	<-g.batches
	<-g.batches // two runners busy, one request each
	rest := []chan answer{do(context.Background(), b, 3), do(context.Background(), b, 4), do(context.Background(), b, 5)}
	waitQueued(t, b, 3)
	close(g.release)
	for _, ch := range append(rest, a1, a2) {
		if r := <-ch; r.err != nil {
			t.Fatal(r.err)
		}
	}
	if p := g.peak.Load(); p != 2 {
		t.Fatalf("%d batches ran at once, want at most (and here exactly) 2", p)
	}
}

func TestLingerGathersABatch(t *testing.T) {
	g := newGate()
	close(g.release)
	b := batch.New(g.fn, batch.Options{Linger: time.Hour, MaxSize: 3})
	// Nothing runs before the batch is full: with an hour's linger, only MaxSize flushes it.
	answers := []chan answer{do(context.Background(), b, 1), do(context.Background(), b, 2)}
	waitQueued(t, b, 2)
	select {
	case got := <-g.batches:
		t.Fatalf("batch %v ran before it was full or lingered", got)
	default:
	}
	answers = append(answers, do(context.Background(), b, 3))
	if got := <-g.batches; len(got) != 3 {
		t.Fatalf("batch %v, want all three", got)
	}
	for _, ch := range answers {
		if r := <-ch; r.err != nil {
			t.Fatal(r.err)
		}
	}
}

func TestLingerFlushesAfterItsWait(t *testing.T) {
	g := newGate()
	close(g.release)
	b := batch.New(g.fn, batch.Options{Linger: 5 * time.Millisecond, MaxSize: 100})
	start := time.Now()
	if _, err := b.Do(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 5*time.Millisecond {
		t.Fatalf("a lone request ran after %v, before its 5 ms linger", waited)
	}
}
