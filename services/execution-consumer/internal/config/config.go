// Package config is the execution-consumer's configuration.
package config

import (
	"errors"

	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// Config is read from the environment.
type Config struct {
	config.Common
	// InternalTLS is the service's identity on the internal hops (mTLS).
	config.InternalTLS
	// GRPCAddr serves health checks.
	GRPCAddr       string `env:"INTEGRATIONS_GRPC_ADDR" envDefault:"127.0.0.1:9092"`
	SettlementAddr string `env:"INTEGRATIONS_SETTLEMENT_ADDR" envDefault:"127.0.0.1:9094"`
	// DispatcherAddr is nudged when a dispatch whose adapter was unreachable is rescheduled.
	DispatcherAddr string `env:"INTEGRATIONS_DISPATCHER_ADDR" envDefault:"127.0.0.1:9091"`
	// Concurrency is the number of attempts one replica runs at once.
	Concurrency int `env:"INTEGRATIONS_CONSUMER_CONCURRENCY" envDefault:"16"`
	// Platform is the key that signs the platform's token on every call to an adapter.
	Platform platformtoken.SignerConfig
}

// Validate checks the consumer's own settings.
func (c Config) Validate() error {
	return errors.Join(c.Common.Validate(), c.InternalTLS.Validate(), c.CheckInternalPlaintext(map[string]string{
		"INTEGRATIONS_GRPC_ADDR": c.GRPCAddr, "INTEGRATIONS_SETTLEMENT_ADDR": c.SettlementAddr, "INTEGRATIONS_DISPATCHER_ADDR": c.DispatcherAddr,
	}),
		config.Between("INTEGRATIONS_CONSUMER_CONCURRENCY", c.Concurrency, 1, 1024),
		c.Platform.Validate(),
	)
}
