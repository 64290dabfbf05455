package dummy

import (
	"errors"

	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// Config is the dummy adapter's environment.
type Config struct {
	config.Common
	// Addr is where AdapterService listens.
	Addr string `env:"INTEGRATIONS_DUMMY_ADAPTER_ADDR" envDefault:"127.0.0.1:9096"`
	// CallbackAddr is the adapter-callback service, used for complete_later.
	CallbackAddr string `env:"INTEGRATIONS_CALLBACK_ADDR" envDefault:"127.0.0.1:9093"`
	// CallbackCAFile, when set, makes callbacks go over TLS, verified against this CA (PEM);
	// CallbackTLS does so against the system's roots.
	CallbackCAFile string `env:"INTEGRATIONS_CALLBACK_CA_FILE"`
	CallbackTLS    bool   `env:"INTEGRATIONS_CALLBACK_TLS" envDefault:"false"`
	// Credential is this adapter's credential, sent as Bearer on every callback.
	Credential string `env:"INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL"`
	// Journal, when set, is a file the adapter appends a line to for every attempt it receives
	// and every piece of work it finishes (see Journal): fault suites count from it.
	Journal string `env:"INTEGRATIONS_DUMMY_JOURNAL"`
	// AdapterID is the dummy's id in the catalog (deploy/catalog/dev.yaml): the audience the
	// platform's tokens must be addressed to.
	AdapterID string `env:"INTEGRATIONS_DUMMY_ADAPTER_ID" envDefault:"dummy"`
	// Platform is the platform's public keys: a call not signed by one of them is refused. The
	// variable is not prefixed with DUMMY: it is the one any adapter on the SDK would read.
	Platform platformtoken.PublicKeysConfig
}

// Validate checks the settings, naming the variable at fault.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate()}
	if c.Addr == "" {
		errs = append(errs, errors.New("INTEGRATIONS_DUMMY_ADAPTER_ADDR: must not be empty"))
	}
	if c.CallbackAddr == "" {
		errs = append(errs, errors.New("INTEGRATIONS_CALLBACK_ADDR: must not be empty"))
	}
	if c.Credential == "" {
		errs = append(errs, errors.New("INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL: required (the adapter's credential for callbacks)"))
	}
	if c.AdapterID == "" {
		errs = append(errs, errors.New("INTEGRATIONS_DUMMY_ADAPTER_ID: must not be empty"))
	}
	errs = append(errs, c.Platform.Validate())
	return errors.Join(errs...)
}
