package mq

import (
	"context"
	"fmt"
)

// DeleteRoutes deletes every queue of the given routes in this Broker's scope — work queue,
// holding queues and DLQ — with whatever messages they hold. It is for tearing down a scope
// (tests, a retired deployment prefix); services never call it. Never call it within moments of
// declaring the routes: on RabbitMQ 3.10 that can disable at-least-once dead-lettering for the
// whole broker (see deadLetterVia).
func (b *RabbitMQ) DeleteRoutes(ctx context.Context, routes ...Route) error {
	p, err := b.publisher(ctx)
	if err != nil {
		return fmt.Errorf("mq: delete routes: %w", err)
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return fmt.Errorf("mq: delete routes: open channel: %w", err)
	}
	defer ch.Close() //nolint:errcheck // a throwaway channel
	for _, r := range routes {
		t, err := plan(b.cfg.Scope, b.cfg.TimeScale, r)
		if err != nil {
			return err
		}
		for _, q := range t.queues() {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				return fmt.Errorf("mq: delete queue %q: %w", q, err)
			}
		}
		b.mu.Lock()
		delete(b.routes, r.Name)
		b.mu.Unlock()
	}
	return nil
}
