// Package config is the settlement service's configuration.
package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/integrations-platform/integrations/pkg/config"
)

// Config is read from the environment.
type Config struct {
	config.Common
	// InternalTLS is the service's identity on the internal hops (mTLS).
	config.InternalTLS
	GRPCAddr string `env:"INTEGRATIONS_GRPC_ADDR" envDefault:"127.0.0.1:9094"`
	// DispatcherAddr is nudged when a next attempt is scheduled, so that the dispatcher times its
	// next pass to the new record's due time.
	DispatcherAddr string `env:"INTEGRATIONS_DISPATCHER_ADDR" envDefault:"127.0.0.1:9091"`
	// SweepInterval is the time between the sweeper's passes over expired leases and deadlines.
	SweepInterval time.Duration `env:"INTEGRATIONS_SWEEP_INTERVAL" envDefault:"1s"`
	// SweepGrace is how long after a lease or deadline passed the sweeper ends the attempt, so
	// that an outcome that arrived just in time is not overridden (not time-scaled: it covers
	// real network and settlement latency).
	SweepGrace time.Duration `env:"INTEGRATIONS_SWEEP_GRACE" envDefault:"5s"`
}

// Validate checks the settings.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate(), c.InternalTLS.Validate(), c.CheckInternalPlaintext(map[string]string{
		"INTEGRATIONS_GRPC_ADDR": c.GRPCAddr, "INTEGRATIONS_DISPATCHER_ADDR": c.DispatcherAddr,
	}), config.Positive("INTEGRATIONS_SWEEP_INTERVAL", c.SweepInterval)}
	if c.SweepGrace < 0 {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_SWEEP_GRACE: %v must not be negative", c.SweepGrace))
	}
	return errors.Join(errs...)
}
