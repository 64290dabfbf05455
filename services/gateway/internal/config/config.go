// Package config is the gateway's configuration.
package config

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/platformtoken"
	"github.com/integrations-platform/integrations/pkg/webhook"
)

// Config is read from the environment.
type Config struct {
	config.Common
	GRPCAddr       string `env:"INTEGRATIONS_GRPC_ADDR" envDefault:"127.0.0.1:9090"`
	HTTPAddr       string `env:"INTEGRATIONS_HTTP_ADDR" envDefault:"127.0.0.1:8080"`
	DispatcherAddr string `env:"INTEGRATIONS_DISPATCHER_ADDR" envDefault:"127.0.0.1:9091"`
	SettlementAddr string `env:"INTEGRATIONS_SETTLEMENT_ADDR" envDefault:"127.0.0.1:9094"`
	// MaxPayloadBytes bounds an invocation's payload (its JSON encoding).
	MaxPayloadBytes int `env:"INTEGRATIONS_MAX_PAYLOAD_BYTES" envDefault:"1048576"`
	// SecretKey seals webhook signing secrets at rest (32 bytes, base64). SecretKeyPrevious opens
	// secrets sealed before a rotation.
	SecretKey         string `env:"INTEGRATIONS_SECRET_KEY,required"`
	SecretKeyPrevious string `env:"INTEGRATIONS_SECRET_KEY_PREVIOUS"`
	// Webhook URLs must be https and resolve to public addresses unless these allow otherwise
	// (local development, tests).
	WebhookAllowHTTP bool `env:"INTEGRATIONS_WEBHOOK_ALLOW_HTTP" envDefault:"false"`
	// AdminToken authenticates the operator endpoints under /api/v1/system/; empty disables them.
	AdminToken          string `env:"INTEGRATIONS_ADMIN_TOKEN"`
	WebhookAllowPrivate bool   `env:"INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE" envDefault:"false"`
	// WebhookDenyCIDRs lists ranges (comma-separated CIDRs) consumers may never be reached at,
	// whatever INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE says: a deployment's pod, service or VPC ranges
	// that are public address space. The gateway and the event router must be given the same.
	WebhookDenyCIDRs string `env:"INTEGRATIONS_WEBHOOK_DENY_CIDRS"`
	// SecretRotationOverlap is how long a rotated-out signing secret keeps signing deliveries
	// beside the new one. Not time-scaled: receivers switch secrets on the wall clock.
	SecretRotationOverlap time.Duration `env:"INTEGRATIONS_SECRET_ROTATION_OVERLAP" envDefault:"24h"`
	// CacheTTL is how long API keys' applications and capabilities read from Postgres are kept
	// (0: read on every call); a catalog change or a revoked key takes effect within it.
	CacheTTL time.Duration `env:"INTEGRATIONS_GATEWAY_CACHE_TTL" envDefault:"5s"`
	// Platform is the key that signs the platform's token on every call to an adapter.
	Platform platformtoken.SignerConfig
}

// WebhookDeny is INTEGRATIONS_WEBHOOK_DENY_CIDRS parsed (Validate has refused an invalid one).
func (c Config) WebhookDeny() []netip.Prefix {
	deny, _ := webhook.ParseDenyCIDRs(c.WebhookDenyCIDRs)
	return deny
}

// Validate checks the gateway's own settings.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate()}
	if _, err := webhook.ParseDenyCIDRs(c.WebhookDenyCIDRs); err != nil {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_WEBHOOK_DENY_CIDRS: %w", err))
	}
	if c.MaxPayloadBytes < 1024 || c.MaxPayloadBytes > 64<<20 {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_MAX_PAYLOAD_BYTES: %d must be between 1024 and 67108864", c.MaxPayloadBytes))
	}
	if c.SecretRotationOverlap < 0 || c.SecretRotationOverlap > 30*24*time.Hour {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_SECRET_ROTATION_OVERLAP: %v must be between 0s and 720h", c.SecretRotationOverlap))
	}
	if c.CacheTTL < 0 || c.CacheTTL > time.Hour {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_GATEWAY_CACHE_TTL: %v must be between 0s and 1h", c.CacheTTL))
	}
	errs = append(errs, c.Platform.Validate())
	return errors.Join(errs...)
}
