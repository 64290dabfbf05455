package lifecycle

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/integrations-platform/integrations/pkg/version"
)

// journal records what happened when, for assertions on order and timing.
type journal struct {
	mu     sync.Mutex
	start  time.Time
	events []string
	at     map[string]time.Duration
}

func newJournal() *journal { return &journal{start: time.Now(), at: map[string]time.Duration{}} }

func (j *journal) note(ev string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, ev)
	j.at[ev] = time.Since(j.start)
}

func (j *journal) list() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.events...)
}

func (j *journal) when(t *testing.T, ev string) time.Duration {
	t.Helper()
	j.mu.Lock()
	defer j.mu.Unlock()
	d, ok := j.at[ev]
	require.True(t, ok, "%q never happened; events: %v", ev, j.events)
	return d
}

// testApp is an App whose signals the test sends.
func testApp(t *testing.T, to Timeouts) (*App, func()) {
	t.Helper()
	a := New(zap.NewNop(), to)
	sigs := make(chan chan<- os.Signal, 1)
	a.signals = func(c chan<- os.Signal) { sigs <- c }
	send := func() {
		select {
		case c := <-sigs:
			sigs <- c
			c <- syscall.SIGTERM
		case <-time.After(5 * time.Second):
			t.Fatal("Run never listened for signals")
		}
	}
	return a, send
}

// run starts a.Run in the background; the channel yields what it returned.
func run(a *App) <-chan error {
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	return done
}

func await(t *testing.T, done <-chan error, within time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		t.Fatalf("Run did not return within %v", within)
		return nil
	}
}

// TestShutdownOrder: NOT_SERVING at the signal; servers and consumers keep working through the
// drain window; then servers stop and Drain workers stop taking; Go workers are cancelled once
// the servers stopped; resources close last, in the order registered, and the flush after them. Nothing in flight, so the
// work context is never cancelled and Run returns long before the soft timeout.
func TestShutdownOrder(t *testing.T) {
	t.Parallel()
	// The soft and hard timeouts are far (30 s, 60 s) from the drain window, so that "right after
	// the drain window, not at the soft timeout" is told apart by seconds a loaded machine
	// cannot add.
	const drain = 300 * time.Millisecond
	a, signal := testApp(t, Timeouts{Drain: drain, Soft: 30 * time.Second, Hard: time.Minute})
	j := newJournal()
	a.OnDrain("health", func() { j.note("not-serving") })
	stopServer := make(chan struct{})
	a.Serve("grpc", func() error { <-stopServer; j.note("server-returned"); return nil },
		func(ctx context.Context) error { j.note("server-stop"); close(stopServer); return nil })
	var workCancelled error
	a.Drain("consumer", func(take, work context.Context) error {
		<-take.Done()
		j.note("consumer-stops-taking")
		workCancelled = work.Err()
		return nil
	})
	a.Go("loop", func(ctx context.Context) error { <-ctx.Done(); j.note("loop-cancelled"); return ctx.Err() })
	// Registered first, flushed after every close: the spans of the closes go out too.
	a.Flush("spans", func(ctx context.Context) error {
		_, hasDeadline := ctx.Deadline()
		assert.True(t, hasDeadline, "a flush's ctx ends at the hard timeout")
		j.note("flush-spans")
		return nil
	})
	a.Close("broker", func() error { j.note("close-broker"); return nil })
	a.CloseContext("postgres", func(ctx context.Context) error {
		_, hasDeadline := ctx.Deadline()
		assert.True(t, hasDeadline, "a closer's ctx ends at the hard timeout")
		j.note("close-postgres")
		return nil
	})
	done := run(a)
	j.start = time.Now()
	signal()
	require.NoError(t, await(t, done, 20*time.Second))

	ev := j.list()
	assert.Equal(t, "not-serving", ev[0], "health first: %v", ev)
	assert.Equal(t, []string{"close-broker", "close-postgres", "flush-spans"}, ev[len(ev)-3:], "closers last, in order, then the flush: %v", ev)
	assert.GreaterOrEqual(t, j.when(t, "server-stop"), drain, "the server serves through the drain window")
	assert.GreaterOrEqual(t, j.when(t, "consumer-stops-taking"), drain, "consumers take messages through the drain window")
	assert.Less(t, j.when(t, "server-stop"), drain+10*time.Second, "the server stops after the drain window, not at the soft timeout")
	assert.GreaterOrEqual(t, j.when(t, "loop-cancelled"), j.when(t, "server-returned"), "Go workers stop after the servers")
	assert.NoError(t, workCancelled, "nothing was in flight: the work context was never cancelled")
	assert.Less(t, j.when(t, "close-postgres"), 10*time.Second, "no waiting for the soft timeout (30 s) when nothing is in flight")
}

// TestSoftTimeoutCancelsWhatIsLeft: after the drain window a Drain worker stops taking; work that
// finishes before the soft timeout runs with its context alive; work still running at the soft
// timeout has its context cancelled then, not before; Run returns once it returned.
func TestSoftTimeoutCancelsWhatIsLeft(t *testing.T) {
	t.Parallel()
	// The short handler ends 100 ms after the drain window, 2.8 s before the soft timeout: a loaded
	// machine cannot push it past; the hard timeout, a minute, is far from the soft one.
	const drain, soft = 100 * time.Millisecond, 3 * time.Second
	a, signal := testApp(t, Timeouts{Drain: drain, Soft: soft, Hard: time.Minute})
	j := newJournal()
	var shortSawCancel error
	a.Drain("short", func(take, work context.Context) error {
		<-take.Done()
		time.Sleep(100 * time.Millisecond) // an in-flight handler finishing its call
		shortSawCancel = work.Err()
		j.note("short-finished")
		return nil
	})
	a.Drain("long", func(take, work context.Context) error {
		<-take.Done()
		j.note("long-stops-taking")
		<-work.Done() // a handler outlasting the soft timeout
		j.note("long-cancelled")
		return work.Err()
	})
	closed := make(chan struct{})
	a.Close("broker", func() error { close(closed); return nil })
	done := run(a)
	j.start = time.Now()
	signal()
	require.NoError(t, await(t, done, soft+20*time.Second), "a worker that returns once cancelled is a clean stop")

	assert.NoError(t, shortSawCancel, "work finishing before the soft timeout is not cancelled")
	assert.GreaterOrEqual(t, j.when(t, "long-stops-taking"), drain)
	assert.GreaterOrEqual(t, j.when(t, "long-cancelled"), soft, "cancelled at the soft timeout, not before")
	assert.Less(t, j.when(t, "long-cancelled"), soft+10*time.Second, "at the soft timeout, not the hard one")
	select {
	case <-closed:
	default:
		t.Error("resources not closed")
	}
}

// TestHardBoundWithHangingParts: a server whose graceful stop never ends, a worker that ignores
// its contexts and a closer that hangs: Run still returns by the hard timeout, saying so.
func TestHardBoundWithHangingParts(t *testing.T) {
	t.Parallel()
	// Seconds apart, so that scheduling noise (hundreds of ms) is a small fraction of each step:
	// returning at the hard timeout (6 s) and not at soft+hard (8 s), the stop ctx ending at the
	// soft timeout (2 s) and not the hard one.
	const soft, hard = 2 * time.Second, 6 * time.Second
	a, signal := testApp(t, Timeouts{Drain: 50 * time.Millisecond, Soft: soft, Hard: hard})
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	var stopCtxEnded atomic.Int64
	j := newJournal()
	a.Serve("grpc", func() error { <-hang; return nil }, func(ctx context.Context) error {
		<-ctx.Done() // a graceful stop that would wait for ever: it is told to stop hard at the soft timeout
		stopCtxEnded.Store(int64(time.Since(j.start)))
		<-hang // and ignores that too
		return nil
	})
	a.Drain("stubborn", func(take, work context.Context) error { <-hang; return nil })
	closerStarted := make(chan struct{})
	a.Close("broker", func() error { close(closerStarted); <-hang; return nil })
	done := run(a)
	j.start = time.Now()
	signal()
	err := await(t, done, hard+20*time.Second)
	took := time.Since(j.start)
	assert.ErrorIs(t, err, ErrShutdownTimeout)
	assert.GreaterOrEqual(t, took, hard-50*time.Millisecond)
	assert.Less(t, took, hard+1500*time.Millisecond, "the hard timeout is a bound")
	select {
	case <-closerStarted:
	default:
		t.Error("resources are closed even under parts still running")
	}
	ended := time.Duration(stopCtxEnded.Load())
	assert.GreaterOrEqual(t, ended, soft, "the server's stop ctx ends at the soft timeout")
	assert.Less(t, ended, soft+2*time.Second, "not at the hard timeout")
}

// TestFailureSkipsTheDrainWindow: a part that fails stops the service without a drain window, and
// Run returns its error.
func TestFailureSkipsTheDrainWindow(t *testing.T) {
	t.Parallel()
	// A drain window of 30 s: returning within 10 s skipped it, with room for a loaded machine.
	a := New(zap.NewNop(), Timeouts{Drain: 30 * time.Second, Soft: 40 * time.Second, Hard: time.Minute})
	boom := errors.New("boom")
	a.Go("broken", func(context.Context) error { return boom })
	start := time.Now()
	err := await(t, run(a), 20*time.Second)
	assert.ErrorIs(t, err, boom)
	assert.Less(t, time.Since(start), 10*time.Second, "no drain window")
}

// TestSecondSignalStopsNow: a second signal ends the drain window and cancels in-flight work at
// once.
func TestSecondSignalStopsNow(t *testing.T) {
	t.Parallel()
	// A drain window of 30 s: "at once" (under 10 s) is told apart from it by far more than a
	// loaded machine's delays.
	a, signal := testApp(t, Timeouts{Drain: 30 * time.Second, Soft: 40 * time.Second, Hard: time.Minute})
	j := newJournal()
	draining := make(chan struct{})
	a.OnDrain("health", func() { close(draining) })
	a.Drain("consumer", func(take, work context.Context) error {
		<-take.Done()
		j.note("stops-taking")
		<-work.Done()
		j.note("cancelled")
		return nil
	})
	done := run(a)
	j.start = time.Now()
	signal()
	<-draining // the first signal was heard; the operator presses Ctrl-C again
	signal()
	require.NoError(t, await(t, done, 20*time.Second))
	assert.Less(t, j.when(t, "cancelled"), 10*time.Second, "not at the drain window's end")
	assert.Less(t, j.when(t, "stops-taking"), 10*time.Second, "not at the drain window's end")
}

func TestTimeouts(t *testing.T) {
	t.Parallel()
	assert.NoError(t, Timeouts{Drain: 5 * time.Second, Soft: 10 * time.Second, Hard: 15 * time.Second}.Validate())
	assert.NoError(t, Timeouts{Hard: time.Second}.Validate())
	assert.ErrorContains(t, Timeouts{Drain: 2 * time.Second, Soft: time.Second, Hard: 3 * time.Second}.Validate(), "drain window")
	assert.ErrorContains(t, Timeouts{Soft: 3 * time.Second, Hard: 3 * time.Second}.Validate(), "soft timeout")
	// New keeps the hard bound whatever it is given.
	a := New(zap.NewNop(), Timeouts{Drain: 20 * time.Second, Soft: 30 * time.Second, Hard: 10 * time.Second})
	assert.Equal(t, Timeouts{Drain: 5 * time.Second, Soft: 5 * time.Second, Hard: 10 * time.Second}, a.t)
	assert.Equal(t, 1250*time.Millisecond, a.Grace())
}

// TestStartLineNamesTheRelease: the one line every program logs when it is up carries its
// release, so a log search tells which build ran.
func TestStartLineNamesTheRelease(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.InfoLevel)
	a := New(zap.New(core), Timeouts{Drain: 10 * time.Millisecond, Soft: time.Second, Hard: 2 * time.Second})
	a.signals = func(chan<- os.Signal) {}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, a.Run(ctx))
	started := logs.FilterMessage("service started").All()
	require.Len(t, started, 1)
	require.Equal(t, version.String(), started[0].ContextMap()["version"])
}

// TestServerFailureStopsTheService: a server whose serve fails stops the service without a drain
// window, as a failed worker does, and Run returns its error named by the server.
func TestServerFailureStopsTheService(t *testing.T) {
	t.Parallel()
	// A drain window of 30 s: returning within 10 s skipped it, with room for a loaded machine.
	a := New(zap.NewNop(), Timeouts{Drain: 30 * time.Second, Soft: 40 * time.Second, Hard: time.Minute})
	boom := errors.New("address in use")
	stopped := make(chan struct{})
	a.Serve("grpc", func() error { return boom }, func(context.Context) error { close(stopped); return nil })
	start := time.Now()
	err := await(t, run(a), 20*time.Second)
	assert.ErrorIs(t, err, boom)
	assert.ErrorContains(t, err, "grpc: ")
	assert.Less(t, time.Since(start), 10*time.Second, "no drain window")
	select {
	case <-stopped:
	default:
		t.Error("the failed server is stopped like the others")
	}
}

// TestCancelledWorkGetsHalfOfWhatIsLeft: a server whose graceful stop outlasts the soft timeout
// keeps the Go workers running until then, not after; work that does not return once cancelled
// is given half of the time left to the hard timeout, and the resources are closed under it
// then — Run returning once they are, before the hard timeout, saying parts still run.
func TestCancelledWorkGetsHalfOfWhatIsLeft(t *testing.T) {
	t.Parallel()
	// Closing starts at soft + (hard-soft)/2 = 6 s: seconds from the soft timeout (2 s) and the
	// hard one (10 s), far more than a loaded machine's delays.
	const soft, hard = 2 * time.Second, 10 * time.Second
	a, signal := testApp(t, Timeouts{Drain: 50 * time.Millisecond, Soft: soft, Hard: hard})
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	j := newJournal()
	a.Serve("grpc", func() error { <-hang; return nil }, func(ctx context.Context) error {
		<-ctx.Done() // a graceful stop cut at the soft timeout, whose server still does not return
		return nil
	})
	a.Go("loop", func(ctx context.Context) error { <-ctx.Done(); j.note("loop-cancelled"); return nil })
	a.Close("broker", func() error { j.note("close-broker"); return nil })
	done := run(a)
	j.start = time.Now()
	signal()
	err := await(t, done, hard+20*time.Second)
	took := time.Since(j.start)

	assert.ErrorIs(t, err, ErrShutdownTimeout, "a server still serving is not a clean stop")
	assert.GreaterOrEqual(t, j.when(t, "loop-cancelled"), soft, "Go workers run until the servers stopped or the soft timeout")
	assert.Less(t, j.when(t, "loop-cancelled"), soft+2*time.Second, "at the soft timeout, not later")
	assert.GreaterOrEqual(t, j.when(t, "close-broker"), soft+(hard-soft)/2-50*time.Millisecond, "cancelled work gets half of what is left")
	assert.Less(t, j.when(t, "close-broker"), hard-2*time.Second, "closing gets the other half")
	assert.Less(t, took, hard-time.Second, "Run returns once the resources are closed, not at the hard timeout")
}

// TestFailedClosesAreLoggedAndTheRestClose: a server's stop and a close that fail are logged by
// name; the closes after them still run, the flush too, and the stop is clean.
func TestFailedClosesAreLoggedAndTheRestClose(t *testing.T) {
	t.Parallel()
	a, signal := testApp(t, Timeouts{Drain: 10 * time.Millisecond, Soft: 10 * time.Second, Hard: 20 * time.Second})
	core, logs := observer.New(zap.InfoLevel)
	a.log = zap.New(core)
	stop := make(chan struct{})
	a.Serve("grpc", func() error { <-stop; return nil }, func(context.Context) error { close(stop); return errors.New("stop refused") })
	j := newJournal()
	a.Close("broker", func() error { j.note("close-broker"); return errors.New("connection reset") })
	a.Close("postgres", func() error { j.note("close-postgres"); return nil })
	a.Flush("spans", func(context.Context) error { j.note("flush-spans"); return errors.New("collector down") })
	done := run(a)
	signal()
	require.NoError(t, await(t, done, 20*time.Second), "a failed close is not a failed service")

	assert.Equal(t, []string{"close-broker", "close-postgres", "flush-spans"}, j.list())
	for msg, field := range map[string]string{"server stop failed": "server", "close failed": "resource", "flush failed": "resource"} {
		entries := logs.FilterMessage(msg).All()
		if assert.Len(t, entries, 1, msg) {
			assert.Contains(t, []string{"grpc", "broker", "spans"}, entries[0].ContextMap()[field], msg)
		}
	}
}
