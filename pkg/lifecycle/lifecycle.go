// Package lifecycle runs a service's parts and shuts them down in a fixed order, within a bound:
//
//  1. at the signal, health reports NOT_SERVING (the OnDrain hooks) while everything keeps
//     working, for the drain window, so that load balancers and Kubernetes stop sending calls;
//  2. then servers stop taking calls (graceful stop) and Drain workers stop taking work (e.g.
//     broker consumers are cancelled), while what is in flight — RPCs, message handlers, adapter
//     calls — goes on; Go workers are cancelled once the servers stopped;
//  3. at the soft timeout what is still in flight is cancelled (servers are stopped hard, the
//     workers' work context ends);
//  4. cancelled work gets half of what is left to return, then resources (broker, pools, client
//     connections) are closed, in the order registered, and then what is flushed last (the
//     spans of everything before, Flush);
//  5. Run returns by the hard timeout, whatever still hangs.
//
// Every time is measured from the signal. A second signal skips what is left of the drain
// window and the soft timeout: an operator pressing Ctrl-C twice wants it to stop now.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/version"
)

// ErrShutdownTimeout is returned by Run when parts were still running at the hard timeout.
var ErrShutdownTimeout = errors.New("shutdown did not finish within the shutdown timeout")

// Timeouts bound a shutdown, each measured from the signal.
type Timeouts struct {
	// Drain is how long the service reports NOT_SERVING while still taking work.
	Drain time.Duration
	// Soft is when work still in flight is cancelled. At least Drain.
	Soft time.Duration
	// Hard is when Run has returned, whatever still hangs. More than Soft.
	Hard time.Duration
}

// Validate reports timeouts out of order.
func (t Timeouts) Validate() error {
	switch {
	case t.Drain < 0:
		return fmt.Errorf("drain window %v is negative", t.Drain)
	case t.Soft < t.Drain:
		return fmt.Errorf("soft timeout %v is shorter than the drain window %v", t.Soft, t.Drain)
	case t.Hard <= t.Soft:
		return fmt.Errorf("shutdown timeout %v is not longer than the soft timeout %v", t.Hard, t.Soft)
	}
	return nil
}

type server struct {
	name  string
	serve func() error
	stop  func(ctx context.Context) error
}

type worker struct {
	name string
	run  func(take, work context.Context) error
	// plain is a worker registered with Go: its one context ends once the servers stopped.
	plain bool
}

type closer struct {
	name  string
	close func(ctx context.Context) error
}

type hook struct {
	name string
	fn   func()
}

// App is one service process.
type App struct {
	log     *zap.Logger
	t       Timeouts
	drains  []hook
	servers []server
	workers []worker
	closers []closer
	flushes []closer
	// signals is where Run hears SIGINT/SIGTERM; tests replace it.
	signals func(chan<- os.Signal)
}

// New returns an App whose shutdown follows t. Timeouts out of order are corrected so that the
// hard bound always holds: Soft is kept below Hard and Drain within Soft.
func New(log *zap.Logger, t Timeouts) *App {
	if t.Hard <= 0 {
		t.Hard = 15 * time.Second
	}
	if t.Soft >= t.Hard || t.Soft < 0 {
		t.Soft = t.Hard / 2
	}
	t.Drain = min(max(t.Drain, 0), t.Soft)
	return &App{log: log, t: t, signals: func(c chan<- os.Signal) {
		signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	}}
}

// OnDrain registers a hook run first at shutdown, before the drain window: it tells callers to go
// elsewhere (health NOT_SERVING) while the service still serves.
func (a *App) OnDrain(name string, fn func()) {
	a.drains = append(a.drains, hook{name, fn})
}

// Serve registers a server: serve blocks until stop makes it return. After the drain window,
// servers are stopped in the order registered; stop's ctx ends at the soft timeout, when a
// graceful stop must turn into a hard one.
func (a *App) Serve(name string, serve func() error, stop func(ctx context.Context) error) {
	a.servers = append(a.servers, server{name, serve, stop})
}

// Go registers a background worker that runs until its context is cancelled, which happens once
// the servers stopped (or at the soft timeout). For a worker whose in-flight work should finish
// first, use Drain.
func (a *App) Go(name string, run func(ctx context.Context) error) {
	a.workers = append(a.workers, worker{name: name, run: func(ctx, _ context.Context) error { return run(ctx) }, plain: true})
}

// Drain registers a worker with two contexts: take ends after the drain window, when it must stop
// taking new work (e.g. cancel its broker consumers); work ends at the soft timeout, when work
// still in flight must be cancelled. run should return soon after work ends.
func (a *App) Drain(name string, run func(take, work context.Context) error) {
	a.workers = append(a.workers, worker{name: name, run: run})
}

// Grace is how long a worker registered with Drain may wait, once its work context ended, for
// cancelled work to return before it gives up on it, and again for one close: twice it fits in
// the time Run leaves for cancelled work to return.
func (a *App) Grace() time.Duration { return (a.t.Hard - a.t.Soft) / 4 }

// Close registers a resource to close last, in the order registered.
func (a *App) Close(name string, fn func() error) {
	a.closers = append(a.closers, closer{name, func(context.Context) error { return fn() }})
}

// CloseContext registers a resource to close last, in the order registered; ctx ends at the hard
// timeout.
func (a *App) CloseContext(name string, fn func(ctx context.Context) error) {
	a.closers = append(a.closers, closer{name, fn})
}

// Flush registers what is flushed after every resource has closed, in the order registered (the
// spans still buffered: flushed last, they include those of the closes); ctx ends at the hard
// timeout.
func (a *App) Flush(name string, fn func(ctx context.Context) error) {
	a.flushes = append(a.flushes, closer{name, fn})
}

// Run starts everything and blocks until SIGINT/SIGTERM, ctx's end, or the first part that fails;
// then it shuts down in order (see the package comment). It returns the first failure, if any, or
// ErrShutdownTimeout if parts were still running at the hard timeout.
func (a *App) Run(ctx context.Context) error {
	sigs := make(chan os.Signal, 2)
	a.signals(sigs)
	defer signal.Stop(sigs)

	failed := make(chan error, len(a.servers)+len(a.workers))
	var serversWG, workersWG sync.WaitGroup
	for _, s := range a.servers {
		serversWG.Add(1)
		go func() {
			defer serversWG.Done()
			if err := s.serve(); err != nil {
				failed <- fmt.Errorf("%s: %w", s.name, err)
			}
		}()
	}
	takeCtx, stopTaking := context.WithCancel(context.Background())
	defer stopTaking()
	plainCtx, stopPlain := context.WithCancel(context.Background())
	defer stopPlain()
	workCtx, cancelWork := context.WithCancel(context.Background())
	defer cancelWork()
	for _, w := range a.workers {
		workersWG.Add(1)
		go func() {
			defer workersWG.Done()
			take := takeCtx
			if w.plain {
				take = plainCtx
			}
			if err := w.run(take, workCtx); err != nil && !errors.Is(err, context.Canceled) {
				failed <- fmt.Errorf("%s: %w", w.name, err)
			}
		}()
	}
	a.log.Info("service started", zap.String("version", version.String()))

	var first error
	drain := a.t.Drain
	select {
	case sig := <-sigs:
		a.log.Info("shutting down", zap.String("cause", "signal"), zap.String("signal", sig.String()),
			zap.Duration("drain", a.t.Drain), zap.Duration("soft_timeout", a.t.Soft), zap.Duration("timeout", a.t.Hard))
	case <-ctx.Done():
		a.log.Info("shutting down", zap.String("cause", "context"))
	case first = <-failed:
		// A failed part is not a service worth sending calls to: no drain window.
		a.log.Error("shutting down", zap.String("cause", "failure"), zap.Error(first))
		drain = 0
	}
	start := time.Now()
	hardCtx, cancelHard := context.WithDeadline(context.Background(), start.Add(a.t.Hard))
	defer cancelHard()
	softCtx, cancelSoft := context.WithDeadline(hardCtx, start.Add(a.t.Soft))
	defer cancelSoft()
	// A second signal ends the drain window and the soft timeout at once.
	go func() {
		select {
		case sig := <-sigs:
			a.log.Warn("second signal: cancelling in-flight work now", zap.String("signal", sig.String()))
			cancelSoft()
		case <-hardCtx.Done():
		}
	}()

	// 1. Tell callers to go elsewhere, and keep serving while they do.
	for _, h := range a.drains {
		h.fn()
	}
	if drain > 0 {
		t := time.NewTimer(drain)
		select {
		case <-t.C:
		case <-softCtx.Done():
		}
		t.Stop()
	}

	// 2. Stop taking work; let what is in flight finish until the soft timeout (3.), when the
	// servers' stop ctx ends and the workers' work context is cancelled.
	a.log.Info("stopping: no new calls or messages taken, in-flight work finishing")
	stopTaking()
	serversDone := make(chan struct{})
	go func() {
		defer close(serversDone)
		for _, s := range a.servers {
			if err := s.stop(softCtx); err != nil {
				a.log.Warn("server stop failed", zap.String("server", s.name), zap.Error(err))
			}
		}
		waitAll(softCtx, waitGroup(&serversWG))
		stopPlain()
		serversWG.Wait()
	}()
	workersDone := waitGroup(&workersWG)
	go func() {
		<-softCtx.Done()
		stopPlain()
		cancelWork()
	}()
	if !waitAll(softCtx, serversDone, workersDone) {
		a.log.Warn("in-flight work not finished at the soft timeout; cancelling it")
		cancelWork()
	}

	// 4. Cancelled work gets half of what is left to return; closing gets the rest.
	now := time.Now()
	returnCtx, cancelReturn := context.WithDeadline(hardCtx, now.Add(time.Until(start.Add(a.t.Hard))/2))
	defer cancelReturn()
	if !waitAll(returnCtx, serversDone, workersDone) {
		a.log.Warn("parts still running after their work was cancelled; closing resources under them")
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for _, c := range a.closers {
			if err := c.close(hardCtx); err != nil {
				a.log.Warn("close failed", zap.String("resource", c.name), zap.Error(err))
			}
		}
		for _, f := range a.flushes {
			if err := f.close(hardCtx); err != nil {
				a.log.Warn("flush failed", zap.String("resource", f.name), zap.Error(err))
			}
		}
	}()
	// 5. The hard bound.
	select {
	case <-closed:
	case <-hardCtx.Done():
	}
	clean := isClosed(closed) && isClosed(serversDone) && isClosed(workersDone)
	if !clean {
		a.log.Error("exiting with parts still running", zap.Duration("timeout", a.t.Hard))
	}
	a.log.Info("service stopped", zap.Duration("took", time.Since(start)))
	if first == nil && !clean {
		first = ErrShutdownTimeout
	}
	return first
}

// waitAll waits for every channel to close, or for ctx; false if ctx ended first.
func waitAll(ctx context.Context, chans ...<-chan struct{}) bool {
	for _, c := range chans {
		select {
		case <-c:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func waitGroup(wg *sync.WaitGroup) <-chan struct{} {
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }()
	return c
}
