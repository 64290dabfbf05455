package mq

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Broker is the message port: what the services, the gateway's system endpoints, the benchmarks
// and the e2e stacks use, whatever the broker behind it. [Dial] picks the provider from the
// configuration. Every provider keeps the same contract — handler-return settlement, a copy
// confirmed before its original is acknowledged, the retry budget counted on x-delivery-attempt,
// dead letters with their reasons, redrive with a fresh budget, superseded settlements told apart
// from lost ones — and proves it by running the one contract suite, pkg/mq/mqtest. A Broker is
// safe for concurrent use.

type Broker interface {
	// Declare declares each route's queues (work queue, delay and retry holding, DLQ) and
	// remembers them, so that a reconnect declares them again.
	Declare(ctx context.Context, routes ...Route) error
	// Consume runs handlers for a declared route until ctx ends (nil) or the Broker closes
	// (ErrClosed); see [RabbitMQ.Consume] for the shutdown and [Drain].
	Consume(ctx context.Context, route string, concurrency int, h Handler, opts ...ConsumeOption) error
	// Publish publishes one message and returns once the broker has confirmed it.
	Publish(ctx context.Context, route string, msg Outgoing) error
	// PublishAll publishes msgs, pipelined, one error per message (nil: confirmed).
	PublishAll(ctx context.Context, route string, msgs []Outgoing) []error
	// PublishAfter is PublishAll for messages due after delays[i], through the route's
	// DelayLevels.
	PublishAfter(ctx context.Context, route string, msgs []Outgoing, delays []time.Duration) []error
	// QueueName is the scoped name of a route's work queue.
	QueueName(route string) string
	// DelayLevels are a declared route's delay levels as applied (time-scaled), ascending.
	DelayLevels(route string) []time.Duration
	// DelayTolerance is how early an arrival a handler may take as on time; a delay level
	// delivers up to its slack late (a tenth of the level up to a second, or a hundredth if
	// more, at least this) rather than a level early.
	DelayTolerance(route string) time.Duration
	// Counters is a snapshot of a route's durability counters in this process.
	Counters(route string) Counters
	// DeadLetters lists up to limit dead letters of a route, oldest first, without taking them.
	DeadLetters(ctx context.Context, route string, limit int) ([]DeadLetter, error)
	// Redrive moves dead letters (all when ids is empty) back with a fresh attempt budget.
	Redrive(ctx context.Context, route string, ids []string) (int, error)
	// Discard removes the named dead letters; an empty ids removes nothing.
	Discard(ctx context.Context, route string, ids []string) (int, error)
	// Diagnose checks each route's queues and runs a probe round trip through its work queue.
	Diagnose(ctx context.Context, routes []Route, timeout time.Duration) []Diagnosis
	// DeleteRoutes deletes every queue of the routes in this scope, with their messages.
	DeleteRoutes(ctx context.Context, routes ...Route) error
	// Close closes the connections; running Consume calls return ErrClosed.
	Close() error
	// CloseContext is Close bounded by ctx.
	CloseContext(ctx context.Context) error
}

// The providers Config.Provider names.
const (
	ProviderRabbitMQ = "rabbitmq" // AMQP 0-9-1; URL amqp:// or amqps://
	ProviderSTOMP    = "stomp"    // STOMP 1.2 (ActiveMQ); URL stomp:// or stomp+ssl://
)

var (
	_ Broker = (*RabbitMQ)(nil)
	_ Broker = (*STOMP)(nil)
)

// Dial connects to the broker Config names and returns the port over it. The provider is
// Config.Provider, or, when that is empty, the one the URL's scheme says; a Provider and a scheme
// that disagree, an unknown provider or an unknown scheme is an error naming the setting (never
// the URL, which carries a password).
func Dial(ctx context.Context, cfg Config) (Broker, error) {
	provider, err := ProviderOf(cfg.Provider, cfg.URL)
	if err != nil {
		return nil, err
	}
	switch provider {
	case ProviderSTOMP:
		s, err := dialSTOMP(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return s, nil
	default:
		r, err := dialRabbitMQ(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

// schemes are the URL schemes each provider takes.
var schemes = map[string]string{
	"amqp": ProviderRabbitMQ, "amqps": ProviderRabbitMQ,
	"stomp": ProviderSTOMP, "stomp+ssl": ProviderSTOMP,
}

// ProviderOf resolves the provider of a configuration: provider ("" → what rawURL's scheme
// says) checked against rawURL's scheme. Configuration loaders call it to fail fast; Dial calls
// it again. Errors name Config.Provider or Config.URL's scheme, never the URL.
func ProviderOf(provider, rawURL string) (string, error) {
	switch provider {
	case "", ProviderRabbitMQ, ProviderSTOMP:
	default:
		return "", fmt.Errorf("mq: Config.Provider %q is not one of %q, %q", provider, ProviderRabbitMQ, ProviderSTOMP)
	}
	if rawURL == "" {
		return "", errors.New("mq: Config.URL is empty")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse's error quotes the URL: say only that it is not one.
		return "", errors.New("mq: Config.URL is not a valid URL")
	}
	byScheme, ok := schemes[u.Scheme]
	if !ok {
		return "", fmt.Errorf("mq: Config.URL's scheme %q is not one of amqp, amqps (%s), stomp, stomp+ssl (%s)",
			u.Scheme, ProviderRabbitMQ, ProviderSTOMP)
	}
	if provider != "" && provider != byScheme {
		return "", fmt.Errorf("mq: Config.Provider %q does not take Config.URL's scheme %q (a %s URL)", provider, u.Scheme, byScheme)
	}
	return byScheme, nil
}
