package democonsumer

import (
	"errors"

	"github.com/integrations-platform/integrations/pkg/config"
)

// Config is the demo consumer's environment.
type Config struct {
	config.Common
	// Addr is where the HTTP server listens.
	Addr string `env:"INTEGRATIONS_DEMO_CONSUMER_ADDR" envDefault:"127.0.0.1:8081"`
	// Secret is the whsec_ signing secret; when empty, SecretFile is read on each request.
	Secret string `env:"INTEGRATIONS_DEMO_CONSUMER_SECRET"`
	// SecretFile holds the signing secret, written once the consumer is registered.
	SecretFile string `env:"INTEGRATIONS_DEMO_CONSUMER_SECRET_FILE"`
}

// Validate checks the settings, naming the variable at fault.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate()}
	if c.Addr == "" {
		errs = append(errs, errors.New("INTEGRATIONS_DEMO_CONSUMER_ADDR: must not be empty"))
	}
	if c.Secret == "" && c.SecretFile == "" {
		errs = append(errs, errors.New("INTEGRATIONS_DEMO_CONSUMER_SECRET or INTEGRATIONS_DEMO_CONSUMER_SECRET_FILE: one is required"))
	}
	return errors.Join(errs...)
}

// SecretSource is where the configured secret comes from.
func (c Config) SecretSource() SecretSource {
	if c.Secret != "" {
		return StaticSecret(c.Secret)
	}
	return FileSecret(c.SecretFile)
}
