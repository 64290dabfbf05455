package mq

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topic exchanges are shared by every scope: a broadcast reaches every subscription of every
// deployment and test run bound to it. The dead-letter exchange has a prefix of its own so that no
// topic name can collide with another topic's DLX.
const (
	topicExchangePrefix = "integrations.topic."
	topicDLXPrefix      = "integrations.topic-dlx."
)

// TopicExchange is the shared fanout exchange of a topic: "integrations.topic.<topic>".
func TopicExchange(topic string) string { return topicExchangePrefix + topic }

// topicCountersKey is the Counters key of a topic's publishes.
func topicCountersKey(topic string) string { return "topic:" + topic }

func validateTopic(topic string) error {
	if err := ValidateName(topic); err != nil {
		return err
	}
	for _, x := range []string{TopicExchange(topic), topicDLXPrefix + topic} {
		if err := ValidateName(x); err != nil {
			return err
		}
	}
	return nil
}

// planSubscription resolves a subscription: its queue "<scope>.<topic>.<subscription>", its DLQ
// "<scope>.<topic>.<subscription>.dlq", and its dead-letter routing key (its own queue name) on
// the topic's direct DLX. A subscription has no retry: one attempt, then its DLQ.
func planSubscription(scope, topic, subscription string) (*topology, error) {
	if err := validateTopic(topic); err != nil {
		return nil, fmt.Errorf("mq: topic: %w", err)
	}
	if err := ValidateName(subscription); err != nil {
		return nil, fmt.Errorf("mq: topic %q: subscription: %w", topic, err)
	}
	route := topic + "." + subscription
	if err := validateRoute(route); err != nil {
		return nil, fmt.Errorf("mq: topic %q: subscription %q: %w", topic, subscription, err)
	}
	t := &topology{
		route:       route,
		queue:       scope + "." + route,
		topic:       TopicExchange(topic),
		dlx:         topicDLXPrefix + topic,
		prefetch:    defaultPrefetch,
		maxAttempts: 1,
	}
	t.dlq = t.queue + ".dlq"
	t.dlxKey = t.queue
	for _, n := range []string{t.queue, t.dlq} {
		if err := ValidateName(n); err != nil {
			return nil, fmt.Errorf("mq: topic %q: %w", topic, err)
		}
	}
	return t, nil
}

// DeclareTopic declares a topic's shared fanout exchange and, in this Broker's scope, the given
// subscriptions: each a queue "<scope>.<topic>.<subscription>" bound to the fanout, and a DLQ
// "<scope>.<topic>.<subscription>.dlq" fed through the topic's direct dead-letter exchange under
// the subscription's own routing key. A subscription's queue keeps broadcasts from the moment it
// is declared, whether or not anyone is subscribed yet. The Broker remembers the topic and the
// subscriptions and declares them again after a reconnect.
func (b *RabbitMQ) DeclareTopic(ctx context.Context, topic string, subscriptions ...string) error {
	if err := validateTopic(topic); err != nil {
		return fmt.Errorf("mq: declare topic: %w", err)
	}
	tops := make([]*topology, 0, len(subscriptions))
	for _, s := range subscriptions {
		t, err := planSubscription(b.cfg.Scope, topic, s)
		if err != nil {
			return err
		}
		tops = append(tops, t)
	}
	p, err := b.publisher(ctx)
	if err != nil {
		return fmt.Errorf("mq: declare topic %q: %w", topic, err)
	}
	if err := declareAll(p.conn, tops, []string{TopicExchange(topic)}); err != nil {
		return fmt.Errorf("mq: declare topic %q: %w", topic, err)
	}
	b.noteDeclared()
	b.mu.Lock()
	b.topics[TopicExchange(topic)] = true
	for _, t := range tops {
		b.routes[t.route] = t
	}
	b.mu.Unlock()
	return nil
}

// PublishTopic broadcasts msg to every subscription of the topic, in every scope, and returns once
// the broker confirmed it. Mandatory: a topic nobody subscribed to returns the message, and that
// is ErrUnroutable. The topic's exchange is declared on first use (publishing to a missing
// exchange would close the shared publishing channel). Counted under Counters("topic:<topic>").
func (b *RabbitMQ) PublishTopic(ctx context.Context, topic string, msg Outgoing) error {
	if err := validateTopic(topic); err != nil {
		return fmt.Errorf("mq: publish to topic: %w", err)
	}
	exchange := TopicExchange(topic)
	b.mu.RLock()
	known := b.topics[exchange]
	b.mu.RUnlock()
	if !known {
		if err := b.DeclareTopic(ctx, topic); err != nil {
			return fmt.Errorf("mq: publish to topic %q: %w", topic, err)
		}
	}
	return b.publishMany(ctx, b.routeStats(topicCountersKey(topic)), "topic "+topic, exchange, func(int) string { return "" }, []Outgoing{msg})[0]
}

// Subscribe consumes a subscription of a topic like Consume consumes a route: `concurrency`
// handlers, until ctx is cancelled (then nil) or the Broker is closed (ErrClosed), reconnecting and
// declaring the subscription again by itself. It first declares the topic and the subscription
// (DeclareTopic), and fails if that fails. Topics do not retry: a handler returning Fail or Reject dead-letters that delivery, for this
// subscription alone, after one attempt (x-dead-reason "failed" or "rejected", confirmed before
// the ack). Message.Route, the Counters key and the DeadLetters/Redrive route of a subscription are
// "<topic>.<subscription>". Options are Consume's (e.g. Drain).
func (b *RabbitMQ) Subscribe(ctx context.Context, topic, subscription string, concurrency int, h Handler, opts ...ConsumeOption) error {
	if err := b.DeclareTopic(ctx, topic, subscription); err != nil {
		return err
	}
	t, ok := b.topology(topic + "." + subscription)
	if !ok {
		// DeleteTopic ran in between.
		return fmt.Errorf("mq: subscribe %q to topic %q: %w", subscription, topic, ErrUnknownRoute)
	}
	return b.consume(ctx, t, concurrency, h, opts...)
}

// DeleteTopic deletes, in this Broker's scope, the given subscriptions' queues and DLQs with their
// messages, and then the topic's exchanges if no subscription of any scope is left bound to them.
// It is for tearing down a scope (tests, a retired deployment prefix); services never call it.
// Like DeleteRoutes, never right after declaring the subscriptions (see deadLetterVia).
func (b *RabbitMQ) DeleteTopic(ctx context.Context, topic string, subscriptions ...string) error {
	if err := validateTopic(topic); err != nil {
		return fmt.Errorf("mq: delete topic: %w", err)
	}
	p, err := b.publisher(ctx)
	if err != nil {
		return fmt.Errorf("mq: delete topic %q: %w", topic, err)
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return fmt.Errorf("mq: delete topic %q: open channel: %w", topic, err)
	}
	defer ch.Close() //nolint:errcheck // a throwaway channel
	for _, s := range subscriptions {
		t, err := planSubscription(b.cfg.Scope, topic, s)
		if err != nil {
			return err
		}
		for _, q := range []string{t.queue, t.dlq} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				return fmt.Errorf("mq: delete queue %q: %w", q, err)
			}
		}
		b.mu.Lock()
		delete(b.routes, t.route)
		b.mu.Unlock()
	}
	b.mu.Lock()
	delete(b.topics, TopicExchange(topic))
	b.mu.Unlock()
	for _, x := range []string{TopicExchange(topic), topicDLXPrefix + topic} {
		// if-unused: another scope's subscription may still be bound. The broker refuses with
		// 406, which closes the channel, so each attempt gets a channel of its own.
		xch, err := p.conn.Channel()
		if err != nil {
			return fmt.Errorf("mq: delete topic %q: open channel: %w", topic, err)
		}
		err = xch.ExchangeDelete(x, true, false)
		var ae *amqp.Error
		if err != nil && !(errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed) {
			return fmt.Errorf("mq: delete exchange %q: %w", x, err)
		}
		if err == nil {
			xch.Close() //nolint:errcheck // a throwaway channel
		}
	}
	return nil
}
