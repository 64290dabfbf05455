// Package config is the settlement service's configuration.
package config

import "github.com/integrations-platform/integrations/pkg/config"

// Config is read from the environment.
type Config struct {
	config.Common
	GRPCAddr string `env:"INTEGRATIONS_GRPC_ADDR" envDefault:"127.0.0.1:9094"`
	// DispatcherAddr is nudged when a next attempt is scheduled, so that the dispatcher times its
	// next pass to the new record's due time.
	DispatcherAddr string `env:"INTEGRATIONS_DISPATCHER_ADDR" envDefault:"127.0.0.1:9091"`
}
