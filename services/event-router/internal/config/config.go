// Package config is the event router's configuration.
package config

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/webhook"
)

// Config is read from the environment.
type Config struct {
	config.Common
	// InternalTLS is the service's identity on the internal hops (mTLS).
	config.InternalTLS
	// SecretKeys open the applications' webhook signing secrets, to sign deliveries.
	config.SecretKeys
	// GRPCAddr serves health checks.
	GRPCAddr      string        `env:"INTEGRATIONS_GRPC_ADDR" envDefault:"127.0.0.1:9095"`
	RelayInterval time.Duration `env:"INTEGRATIONS_RELAY_INTERVAL" envDefault:"1s"`
	// EventStaleAfter is how overdue a pending event's notice may be before the relay publishes
	// it again without other evidence that it was lost (a delivery record lost in a Postgres
	// crash; a notice dead-lettered where the relay does not look). Time-scaled, but never below
	// twice the events route's port-level budget: see StaleAfter.
	EventStaleAfter time.Duration `env:"INTEGRATIONS_EVENT_STALE_AFTER" envDefault:"10m"`
	// EventRecoverInterval is how often the relay looks for lost notices: overdue ones and those
	// in the events route's DLQ, which it publishes again at once; and for held events a race
	// left set aside after their predecessor was done (store.EventUnholdReleased). Time-scaled,
	// at least 1 s.
	EventRecoverInterval time.Duration `env:"INTEGRATIONS_EVENT_RECOVER_INTERVAL" envDefault:"10s"`
	Concurrency          int           `env:"INTEGRATIONS_DELIVERY_CONCURRENCY" envDefault:"32"`
	DeliveryTimeout      time.Duration `env:"INTEGRATIONS_DELIVERY_TIMEOUT" envDefault:"10s"`
	// RetryDelays is the delivery schedule, before time scaling: the wait before attempt 2, 3, …;
	// an event gets 1+len(RetryDelays) attempts, then it is dead.
	RetryDelays []time.Duration `env:"INTEGRATIONS_EVENT_RETRY_DELAYS" envDefault:"1m,5m,30m,2h,6h" envSeparator:","`
	// PerAppConcurrency bounds one application's deliveries in flight in one replica, so that a
	// slow or hanging consumer cannot take every worker.
	PerAppConcurrency int `env:"INTEGRATIONS_DELIVERY_PER_APP_CONCURRENCY" envDefault:"8"`
	// PerAppPatience is how long a notice of an application at its bound waits for a slot before
	// it is deferred through the smallest delay level (1 s): healthy deliveries free a slot in
	// milliseconds, a hanging consumer holds it for the delivery timeout.
	PerAppPatience time.Duration `env:"INTEGRATIONS_DELIVERY_PER_APP_PATIENCE" envDefault:"100ms"`
	// Deliveries go to public addresses only unless allowed (local development, tests).
	WebhookAllowPrivate bool `env:"INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE" envDefault:"false"`
	// WebhookDenyCIDRs lists ranges (comma-separated CIDRs) consumers may never be reached at,
	// whatever INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE says: a deployment's pod, service or VPC ranges
	// that are public address space. The gateway and the event router must be given the same.
	WebhookDenyCIDRs string `env:"INTEGRATIONS_WEBHOOK_DENY_CIDRS"`
}

// WebhookDeny is INTEGRATIONS_WEBHOOK_DENY_CIDRS parsed (Validate has refused an invalid one).
func (c Config) WebhookDeny() []netip.Prefix {
	deny, _ := webhook.ParseDenyCIDRs(c.WebhookDenyCIDRs)
	return deny
}

// Validate checks the router's own settings.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate(), c.InternalTLS.Validate(), c.CheckInternalPlaintext(map[string]string{"INTEGRATIONS_GRPC_ADDR": c.GRPCAddr})}
	if _, err := webhook.ParseDenyCIDRs(c.WebhookDenyCIDRs); err != nil {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_WEBHOOK_DENY_CIDRS: %w", err))
	}
	errs = append(errs,
		config.AtLeast("INTEGRATIONS_EVENT_STALE_AFTER", c.EventStaleAfter, time.Second),
		config.Positive("INTEGRATIONS_EVENT_RECOVER_INTERVAL", c.EventRecoverInterval),
		config.Between("INTEGRATIONS_DELIVERY_PER_APP_PATIENCE", c.PerAppPatience, 0, time.Second),
		config.Positive("INTEGRATIONS_RELAY_INTERVAL", c.RelayInterval),
		config.Between("INTEGRATIONS_DELIVERY_CONCURRENCY", c.Concurrency, 1, 1024),
		config.Positive("INTEGRATIONS_DELIVERY_TIMEOUT", c.DeliveryTimeout),
	)
	if len(c.RetryDelays) == 0 || len(c.RetryDelays) > 20 {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_EVENT_RETRY_DELAYS: %d delays; give between 1 and 20", len(c.RetryDelays)))
	}
	for _, d := range c.RetryDelays {
		errs = append(errs, config.Positive("INTEGRATIONS_EVENT_RETRY_DELAYS", d))
	}
	// Below the handler concurrency, so that one application's hanging consumer cannot hold
	// every worker.
	if c.PerAppConcurrency < 1 || c.PerAppConcurrency >= c.Concurrency {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_DELIVERY_PER_APP_CONCURRENCY: %d must be at least 1 and below INTEGRATIONS_DELIVERY_CONCURRENCY (%d)",
			c.PerAppConcurrency, c.Concurrency))
	}
	return errors.Join(errs...)
}

// ScaledRetryDelays is the delivery schedule with the time scale applied.
func (c Config) ScaledRetryDelays() []time.Duration {
	out := make([]time.Duration, len(c.RetryDelays))
	for i, d := range c.RetryDelays {
		out[i] = max(c.Scale(d), time.Millisecond)
	}
	return out
}

// StaleAfter is EventStaleAfter time-scaled, but at least twice noticeBudget (the events route's
// port-level retry budget as the port applies it, mq.RetryDelays): a notice still being retried
// through its budget is not lost, and publishing it again would only make a duplicate. A scaled
// run so recovers a notice lost without a trace in seconds; unscaled, the variable stands.
func (c Config) StaleAfter(noticeBudget time.Duration) time.Duration {
	return max(c.Scale(c.EventStaleAfter), 2*noticeBudget, time.Second)
}

// RelayClaimTTL is the relay's claim on the events it publishes (unscaled: relay.DefaultClaimTTL)
// time-scaled, but at least 5 s. The claim only has to outlast one claim-publish-mark round,
// which takes milliseconds (a batch of 500 confirms well under a second); what it costs is the
// wait for the other relays when one is killed between claim and publish, and that wait should
// scale with the run like every other schedule (30 s unscaled made a scaled run's kill -9 wait
// 30 s). The floor keeps it well above a confirm a loaded broker delays; a claim that still
// expires mid-publish only makes a duplicate notice: the slower relay's mark no longer matches
// the claim, and the event's delivery claim absorbs the second notice.
func (c Config) RelayClaimTTL(unscaled time.Duration) time.Duration {
	return max(c.Scale(unscaled), 5*time.Second)
}

// RecoverEvery is EventRecoverInterval time-scaled, at least 1 s: the checks are cheap (an
// indexed query and a look at the DLQ's head) but need not run more often than a notice's retry.
func (c Config) RecoverEvery() time.Duration {
	return max(c.Scale(c.EventRecoverInterval), time.Second)
}
