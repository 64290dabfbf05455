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
	"net"
	"net/http"
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

// HTTP registers srv, serving on lis, as a server: its stop is graceful until the soft timeout,
// then hard, since Shutdown alone leaves the requests still running.
func (a *App) HTTP(name string, srv *http.Server, lis net.Listener) {
	a.Serve(name,
		func() error {
			if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", name, err)
			}
			return nil
		},
		func(ctx context.Context) error {
			if err := srv.Shutdown(ctx); err != nil {
				return errors.Join(err, srv.Close())
			}
			return nil
		})
}

// Go registers a background worker that runs until its context is cancelled, which happens once
// the servers stopped (or at the soft timeout). For a worker whose in-flight work should finish
// first, use Drain.
func (a *App) Go(name string, run func(ctx context.Context) error) {
	a.workers = append(a.workers, worker{name: name, run: func(ctx, _ context.Context) error { return run(ctx) }, plain: true})
}

// Every is the loop of a worker that passes on a schedule: it runs pass at once, then every
// interval and whenever wake receives (nil: never), until ctx ends, and returns nil. A pass that
// fails while ctx lives is logged as msg; the next one tries again.
func Every(ctx context.Context, interval time.Duration, wake <-chan struct{}, log *zap.Logger, msg string, pass func(context.Context) error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := pass(ctx); err != nil && ctx.Err() == nil {
			log.Warn(msg, zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-wake:
		}
	}
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

	p := a.start()
	defer p.release()
	drain, first := a.awaitCause(ctx, sigs, p.failed)
	s := a.newShutdown(sigs)
	defer s.release()

	a.drainWindow(s, drain)
	a.stopTaking(s, p)
	a.awaitReturn(s, p)
	closed := a.closeAll(s)
	return a.exit(s, p, closed, first)
}

// parts is what start left running: the servers and the workers, the contexts that stop them,
// and once stopTaking has begun, whether each kind has returned.
type parts struct {
	failed           chan error
	servers, workers sync.WaitGroup
	// take ends after the drain window (Drain workers stop taking work), plain once the servers
	// stopped (Go workers), work at the soft timeout (in-flight work is cancelled).
	take, plain, work                 context.Context
	stopTaking, stopPlain, cancelWork context.CancelFunc
	serversDone, workersDone          <-chan struct{}
}

func (p *parts) release() {
	p.cancelWork()
	p.stopPlain()
	p.stopTaking()
}

// start runs every server and worker; a failure of one is sent on parts.failed.
func (a *App) start() *parts {
	p := &parts{failed: make(chan error, len(a.servers)+len(a.workers))}
	for _, s := range a.servers {
		p.servers.Add(1)
		go func() {
			defer p.servers.Done()
			if err := s.serve(); err != nil {
				p.failed <- fmt.Errorf("%s: %w", s.name, err)
			}
		}()
	}
	p.take, p.stopTaking = context.WithCancel(context.Background())
	p.plain, p.stopPlain = context.WithCancel(context.Background())
	p.work, p.cancelWork = context.WithCancel(context.Background())
	for _, w := range a.workers {
		p.workers.Add(1)
		go func() {
			defer p.workers.Done()
			take := p.take
			if w.plain {
				take = p.plain
			}
			if err := w.run(take, p.work); err != nil && !errors.Is(err, context.Canceled) {
				p.failed <- fmt.Errorf("%s: %w", w.name, err)
			}
		}()
	}
	a.log.Info("service started", zap.String("version", version.String()))
	return p
}

// awaitCause waits for the cause of the shutdown — a signal, ctx's end, or a part's failure —
// logs it, and returns the drain window to keep and the failure, if that was the cause.
func (a *App) awaitCause(ctx context.Context, sigs <-chan os.Signal, failed <-chan error) (time.Duration, error) {
	select {
	case sig := <-sigs:
		a.log.Info("shutting down", zap.String("cause", "signal"), zap.String("signal", sig.String()),
			zap.Duration("drain", a.t.Drain), zap.Duration("soft_timeout", a.t.Soft), zap.Duration("timeout", a.t.Hard))
	case <-ctx.Done():
		a.log.Info("shutting down", zap.String("cause", "context"))
	case err := <-failed:
		// A failed part is not a service worth sending calls to: no drain window.
		a.log.Error("shutting down", zap.String("cause", "failure"), zap.Error(err))
		return 0, err
	}
	return a.t.Drain, nil
}

// shutdown is one shutdown's clock: the soft and hard timeouts, measured from its start.
type shutdown struct {
	start                  time.Time
	soft, hard             context.Context
	cancelSoft, cancelHard context.CancelFunc
}

// newShutdown starts the shutdown's clock. A second signal ends the drain window and the soft
// timeout at once.
func (a *App) newShutdown(sigs <-chan os.Signal) *shutdown {
	s := &shutdown{start: time.Now()}
	s.hard, s.cancelHard = context.WithDeadline(context.Background(), s.start.Add(a.t.Hard))
	s.soft, s.cancelSoft = context.WithDeadline(s.hard, s.start.Add(a.t.Soft))
	go func() {
		select {
		case sig := <-sigs:
			a.log.Warn("second signal: cancelling in-flight work now", zap.String("signal", sig.String()))
			s.cancelSoft()
		case <-s.hard.Done():
		}
	}()
	return s
}

func (s *shutdown) release() {
	s.cancelSoft()
	s.cancelHard()
}

// drainWindow is step 1: callers are told to go elsewhere (the OnDrain hooks), and everything
// keeps serving for drain — or until the soft timeout, which a second signal brings forward.
func (a *App) drainWindow(s *shutdown, drain time.Duration) {
	for _, h := range a.drains {
		h.fn()
	}
	if drain <= 0 {
		return
	}
	t := time.NewTimer(drain)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.soft.Done():
	}
}

// stopTaking is steps 2 and 3: servers stop taking calls and Drain workers stop taking work,
// while what is in flight finishes until the soft timeout; then the servers' stop ctx ends and
// the workers' work context is cancelled.
func (a *App) stopTaking(s *shutdown, p *parts) {
	a.log.Info("stopping: no new calls or messages taken, in-flight work finishing")
	p.stopTaking()
	p.serversDone = a.stopServers(s, p)
	p.workersDone = waitGroup(&p.workers)
	go func() {
		<-s.soft.Done()
		p.stopPlain()
		p.cancelWork()
	}()
	if !waitAll(s.soft, p.serversDone, p.workersDone) {
		a.log.Warn("in-flight work not finished at the soft timeout; cancelling it")
		p.cancelWork()
	}
}

// stopServers stops the servers in the order registered, and the Go workers once the servers
// have returned (or at the soft timeout); the channel closes once the servers have returned.
func (a *App) stopServers(s *shutdown, p *parts) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, srv := range a.servers {
			if err := srv.stop(s.soft); err != nil {
				a.log.Warn("server stop failed", zap.String("server", srv.name), zap.Error(err))
			}
		}
		waitAll(s.soft, waitGroup(&p.servers))
		p.stopPlain()
		p.servers.Wait()
	}()
	return done
}

// awaitReturn is step 4's first half: cancelled work gets half of what is left before the hard
// timeout to return; closing gets the rest.
func (a *App) awaitReturn(s *shutdown, p *parts) {
	ctx, cancel := context.WithDeadline(s.hard, time.Now().Add(time.Until(s.start.Add(a.t.Hard))/2))
	defer cancel()
	if !waitAll(ctx, p.serversDone, p.workersDone) {
		a.log.Warn("parts still running after their work was cancelled; closing resources under them")
	}
}

// closeAll is step 4's second half: the resources close in the order registered, then what is
// flushed last; each is bounded by the hard timeout. The channel closes once all have returned.
func (a *App) closeAll(s *shutdown) <-chan struct{} {
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for _, c := range a.closers {
			if err := c.close(s.hard); err != nil {
				a.log.Warn("close failed", zap.String("resource", c.name), zap.Error(err))
			}
		}
		for _, f := range a.flushes {
			if err := f.close(s.hard); err != nil {
				a.log.Warn("flush failed", zap.String("resource", f.name), zap.Error(err))
			}
		}
	}()
	return closed
}

// exit is step 5: it waits for the closes, up to the hard timeout, says whether anything is
// still running, and returns first — or ErrShutdownTimeout if nothing failed but parts remain.
func (a *App) exit(s *shutdown, p *parts, closed <-chan struct{}, first error) error {
	select {
	case <-closed:
	case <-s.hard.Done():
	}
	clean := isClosed(closed) && isClosed(p.serversDone) && isClosed(p.workersDone)
	if !clean {
		a.log.Error("exiting with parts still running", zap.Duration("timeout", a.t.Hard))
	}
	a.log.Info("service stopped", zap.Duration("took", time.Since(s.start)))
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
