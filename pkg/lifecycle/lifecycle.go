// Package lifecycle runs a service's parts and shuts them down in a fixed order: servers stop
// taking work (health NOT_SERVING, graceful stop with a hard timer), then background workers are
// cancelled and awaited, then resources (broker, pools) are closed.
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
)

type server struct {
	name  string
	serve func() error
	stop  func(ctx context.Context) error
}

type worker struct {
	name string
	run  func(ctx context.Context) error
}

type closer struct {
	name  string
	close func() error
}

// App is one service process.
type App struct {
	log     *zap.Logger
	timeout time.Duration
	servers []server
	workers []worker
	closers []closer
}

// New returns an App whose whole shutdown is bounded by timeout.
func New(log *zap.Logger, timeout time.Duration) *App {
	return &App{log: log, timeout: timeout}
}

// Serve registers a server: serve blocks until stop makes it return. Servers stop first, in the
// order registered.
func (a *App) Serve(name string, serve func() error, stop func(ctx context.Context) error) {
	a.servers = append(a.servers, server{name, serve, stop})
}

// Go registers a background worker that runs until its context is cancelled. Workers are
// cancelled after the servers stopped.
func (a *App) Go(name string, run func(ctx context.Context) error) {
	a.workers = append(a.workers, worker{name, run})
}

// Close registers a resource to close last, in the order registered.
func (a *App) Close(name string, fn func() error) {
	a.closers = append(a.closers, closer{name, fn})
}

// Run starts everything and blocks until SIGINT/SIGTERM, ctx's end, or the first part that fails;
// then it shuts down in order. It returns the first failure, if any.
func (a *App) Run(ctx context.Context) error {
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

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
	workCtx, cancelWork := context.WithCancel(context.Background())
	defer cancelWork()
	for _, w := range a.workers {
		workersWG.Add(1)
		go func() {
			defer workersWG.Done()
			if err := w.run(workCtx); err != nil && !errors.Is(err, context.Canceled) {
				failed <- fmt.Errorf("%s: %w", w.name, err)
			}
		}()
	}
	a.log.Info("service started")

	var first error
	select {
	case <-ctx.Done():
		a.log.Info("shutting down", zap.String("cause", "signal"))
	case first = <-failed:
		a.log.Error("shutting down", zap.String("cause", "failure"), zap.Error(first))
	}

	shutdownCtx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	for _, s := range a.servers {
		if err := s.stop(shutdownCtx); err != nil {
			a.log.Warn("server stop failed", zap.String("server", s.name), zap.Error(err))
		}
	}
	waitOrTimeout(shutdownCtx, &serversWG)
	cancelWork()
	if !waitOrTimeout(shutdownCtx, &workersWG) {
		a.log.Warn("workers did not stop within the shutdown timeout")
	}
	for _, c := range a.closers {
		if err := c.close(); err != nil {
			a.log.Warn("close failed", zap.String("resource", c.name), zap.Error(err))
		}
	}
	a.log.Info("service stopped")
	return first
}

func waitOrTimeout(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}
