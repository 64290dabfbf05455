// Package config is the event router's configuration.
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
	// GRPCAddr serves health checks.
	GRPCAddr          string        `env:"INTEGRATIONS_GRPC_ADDR" envDefault:"127.0.0.1:9095"`
	SecretKey         string        `env:"INTEGRATIONS_SECRET_KEY,required"`
	SecretKeyPrevious string        `env:"INTEGRATIONS_SECRET_KEY_PREVIOUS"`
	RelayInterval     time.Duration `env:"INTEGRATIONS_RELAY_INTERVAL" envDefault:"1s"`
	Concurrency       int           `env:"INTEGRATIONS_DELIVERY_CONCURRENCY" envDefault:"16"`
	DeliveryTimeout   time.Duration `env:"INTEGRATIONS_DELIVERY_TIMEOUT" envDefault:"10s"`
	// Deliveries go to public addresses only unless allowed (local development, tests).
	WebhookAllowPrivate bool `env:"INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE" envDefault:"false"`
}

// Validate checks the router's own settings.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate()}
	if c.RelayInterval <= 0 {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_RELAY_INTERVAL: %v must be positive", c.RelayInterval))
	}
	if c.Concurrency < 1 || c.Concurrency > 1024 {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_DELIVERY_CONCURRENCY: %d must be between 1 and 1024", c.Concurrency))
	}
	if c.DeliveryTimeout <= 0 {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_DELIVERY_TIMEOUT: %v must be positive", c.DeliveryTimeout))
	}
	return errors.Join(errs...)
}
