// Package config is the dispatcher's configuration.
package config

import (
	"errors"
	"time"

	"github.com/integrations-platform/integrations/pkg/config"
)

// Config is read from the environment.
type Config struct {
	config.Common
	// InternalTLS is the service's identity on the internal hops (mTLS).
	config.InternalTLS
	GRPCAddr string `env:"INTEGRATIONS_GRPC_ADDR" envDefault:"127.0.0.1:9091"`
	// Interval is the time between scheduled passes; a nudge starts one at once.
	Interval time.Duration `env:"INTEGRATIONS_DISPATCH_INTERVAL" envDefault:"1s"`
	// ClaimTTL is how long a claimed dispatch row is reserved for the dispatcher that claimed it;
	// a row whose publish failed is retried once its claim expires.
	ClaimTTL time.Duration `env:"INTEGRATIONS_DISPATCH_CLAIM_TTL" envDefault:"30s"`
	// BatchSize is the most rows one pass claims at a time.
	BatchSize int `env:"INTEGRATIONS_DISPATCH_BATCH_SIZE" envDefault:"500"`
	// RecoverInterval is how often the dispatcher looks at the executions route's DLQ for
	// dispatches it can send back (see dispatch.Recoverer). Time-scaled, at least 1 s.
	RecoverInterval time.Duration `env:"INTEGRATIONS_DISPATCH_RECOVER_INTERVAL" envDefault:"10s"`
}

// RecoverEvery is RecoverInterval time-scaled, at least 1 s: a look at the DLQ's head is cheap,
// but need not run more often than a dispatch's port-level retry.
func (c Config) RecoverEvery() time.Duration {
	return max(c.Scale(c.RecoverInterval), time.Second)
}

// Validate checks the dispatcher's own settings.
func (c Config) Validate() error {
	return errors.Join(c.Common.Validate(), c.InternalTLS.Validate(), c.CheckInternalPlaintext(map[string]string{"INTEGRATIONS_GRPC_ADDR": c.GRPCAddr}),
		config.Positive("INTEGRATIONS_DISPATCH_INTERVAL", c.Interval),
		config.AtLeast("INTEGRATIONS_DISPATCH_CLAIM_TTL", c.ClaimTTL, time.Second),
		config.Positive("INTEGRATIONS_DISPATCH_RECOVER_INTERVAL", c.RecoverInterval),
		config.Between("INTEGRATIONS_DISPATCH_BATCH_SIZE", c.BatchSize, 1, 10000),
	)
}
