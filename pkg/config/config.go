// Package config loads a service's settings from the environment. Every setting has a variable
// named INTEGRATIONS_*, a documented default where one is safe, and validation that fails fast
// with the variable's name.
package config

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/integrations-platform/integrations/pkg/lifecycle"
)

// Common holds the settings every service shares.
type Common struct {
	LogLevel    string `env:"INTEGRATIONS_LOG_LEVEL" envDefault:"info"`
	DatabaseURL string `env:"INTEGRATIONS_DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/integrations?sslmode=disable"`
	// DatabaseMaxConns sizes the service's connection pool; 0 keeps the URL's pool_max_conns or
	// the service's own default.
	DatabaseMaxConns int     `env:"INTEGRATIONS_DATABASE_MAX_CONNS" envDefault:"0"`
	AMQPURL          string  `env:"INTEGRATIONS_AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/"`
	QueueScope       string  `env:"INTEGRATIONS_QUEUE_SCOPE" envDefault:"integrations"`
	TimeScale        float64 `env:"INTEGRATIONS_TIME_SCALE" envDefault:"1"`
	MetricsAddr      string  `env:"INTEGRATIONS_METRICS_ADDR"`
	// Pprof serves net/http/pprof on the metrics address too: for diagnosis, off by default.
	Pprof bool `env:"INTEGRATIONS_PPROF" envDefault:"false"`
	// GRPCReflection serves the gRPC reflection service on the service's gRPC port (grpcurl
	// without .proto files): for development, off by default.
	GRPCReflection bool `env:"INTEGRATIONS_GRPC_REFLECTION" envDefault:"false"`
	// A shutdown, measured from SIGTERM: health NOT_SERVING for the drain window while the service
	// still works, then no new calls or messages taken; in-flight work cancelled at the soft
	// timeout; the process gone by the shutdown timeout (see pkg/lifecycle). Not time-scaled: they
	// are about load balancers and Kubernetes, which run on the wall clock. The drain window and
	// the soft timeout, when unset, are derived from the shutdown timeout (see deriveShutdown).
	DrainWindow         time.Duration `env:"INTEGRATIONS_DRAIN_WINDOW"`
	ShutdownSoftTimeout time.Duration `env:"INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT"`
	ShutdownTimeout     time.Duration `env:"INTEGRATIONS_SHUTDOWN_TIMEOUT" envDefault:"15s"`
}

// Unset shutdown phases are derived from the shutdown timeout T: the drain window is
// min(maxDefaultDrain, T/3), the soft timeout 2T/3 — 5 s and 10 s for the default 15 s. Fixed
// defaults would break an upgrade: a deployment that set only INTEGRATIONS_SHUTDOWN_TIMEOUT to
// 10 s or less, valid before the phases existed, would fail validation against a fixed 10 s
// soft timeout. Only values set explicitly can be inconsistent, and the error names them.
const maxDefaultDrain = 5 * time.Second

// deriveShutdown fills the drain window and soft timeout that the environment leaves unset
// (lookup is os.LookupEnv; an empty value counts as unset), keeping them consistent with the
// phases that are set: a derived drain is no longer than an explicit soft timeout, a derived
// soft timeout no shorter than an explicit drain window.
func (c *Common) deriveShutdown(lookup func(string) (string, bool)) {
	set := func(name string) bool { v, ok := lookup(name); return ok && v != "" }
	hard := c.ShutdownTimeout
	drainSet, softSet := set("INTEGRATIONS_DRAIN_WINDOW"), set("INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT")
	if !drainSet {
		c.DrainWindow = max(min(maxDefaultDrain, (hard/3).Truncate(time.Millisecond)), 0)
		if softSet {
			c.DrainWindow = max(min(c.DrainWindow, c.ShutdownSoftTimeout), 0)
		}
	}
	if !softSet {
		c.ShutdownSoftTimeout = max((hard * 2 / 3).Truncate(time.Millisecond), c.DrainWindow, 0)
	}
}

// shutdownDeriver is Common's deriveShutdown, promoted to every settings struct embedding it.
type shutdownDeriver interface {
	deriveShutdown(lookup func(string) (string, bool))
}

// Shutdown is the shutdown's timeouts for lifecycle.New.
func (c Common) Shutdown() lifecycle.Timeouts {
	return lifecycle.Timeouts{Drain: c.DrainWindow, Soft: c.ShutdownSoftTimeout, Hard: c.ShutdownTimeout}
}

// Validate checks the shared settings.
func (c Common) Validate() error {
	var errs []error
	if c.TimeScale <= 0 || c.TimeScale > 1 {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_TIME_SCALE: %v must be in (0, 1]", c.TimeScale))
	}
	if c.DatabaseMaxConns < 0 || c.DatabaseMaxConns > 1000 {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_DATABASE_MAX_CONNS: %d must be between 0 and 1000", c.DatabaseMaxConns))
	}
	switch {
	case c.ShutdownTimeout <= 0:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_SHUTDOWN_TIMEOUT: %v must be positive", c.ShutdownTimeout))
	case c.DrainWindow < 0:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_DRAIN_WINDOW: %v must not be negative", c.DrainWindow))
	case c.DrainWindow >= c.ShutdownTimeout:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_DRAIN_WINDOW: %v must be less than INTEGRATIONS_SHUTDOWN_TIMEOUT (%v)",
			c.DrainWindow, c.ShutdownTimeout))
	case c.ShutdownSoftTimeout < c.DrainWindow:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT: %v must be at least INTEGRATIONS_DRAIN_WINDOW (%v)",
			c.ShutdownSoftTimeout, c.DrainWindow))
	case c.ShutdownSoftTimeout >= c.ShutdownTimeout:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT: %v must be less than INTEGRATIONS_SHUTDOWN_TIMEOUT (%v)",
			c.ShutdownSoftTimeout, c.ShutdownTimeout))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_LOG_LEVEL: %q is not one of debug, info, warn, error", c.LogLevel))
	}
	return errors.Join(errs...)
}

// Scale shrinks a duration by the configured time scale (INTEGRATIONS_TIME_SCALE), so that
// tests and demos run a schedule of minutes and hours in seconds.
func (c Common) Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.TimeScale)
}

// Validator is implemented by settings structs that check themselves after loading.
type Validator interface {
	Validate() error
}

// Load parses the environment into a T and validates it. The error names every variable that is
// missing or malformed.
func Load[T any]() (T, error) {
	var cfg T
	if err := env.Parse(&cfg); err != nil {
		return cfg, fmt.Errorf("configuration: %w", err)
	}
	if d, ok := any(&cfg).(shutdownDeriver); ok {
		d.deriveShutdown(os.LookupEnv)
	}
	if v, ok := any(&cfg).(Validator); ok {
		if err := v.Validate(); err != nil {
			return cfg, fmt.Errorf("configuration: %w", err)
		}
	}
	return cfg, nil
}
