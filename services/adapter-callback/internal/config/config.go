// Package config is the adapter-callback service's configuration.
package config

import (
	"errors"

	"github.com/integrations-platform/integrations/pkg/config"
)

// Config is read from the environment.
type Config struct {
	config.Common
	// InternalTLS is the service's identity on the internal hops (mTLS).
	config.InternalTLS
	// PublicTLS is served on the gRPC port: adapters call it, with their credential.
	config.PublicTLS
	GRPCAddr       string `env:"INTEGRATIONS_GRPC_ADDR" envDefault:"127.0.0.1:9093"`
	SettlementAddr string `env:"INTEGRATIONS_SETTLEMENT_ADDR" envDefault:"127.0.0.1:9094"`
}

// Validate checks the settings: the port is client-facing, the settlement hop internal.
func (c Config) Validate() error {
	return errors.Join(
		c.Common.Validate(),
		c.InternalTLS.Validate(),
		c.CheckInternalPlaintext(map[string]string{"INTEGRATIONS_SETTLEMENT_ADDR": c.SettlementAddr}),
		c.PublicTLS.Check(map[string]string{"INTEGRATIONS_GRPC_ADDR": c.GRPCAddr}),
	)
}
