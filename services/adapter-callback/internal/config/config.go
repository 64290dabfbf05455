// Package config is the adapter-callback service's configuration.
package config

import "github.com/integrations-platform/integrations/pkg/config"

// Config is read from the environment.
type Config struct {
	config.Common
	GRPCAddr       string `env:"INTEGRATIONS_GRPC_ADDR" envDefault:"127.0.0.1:9093"`
	SettlementAddr string `env:"INTEGRATIONS_SETTLEMENT_ADDR" envDefault:"127.0.0.1:9094"`
}
