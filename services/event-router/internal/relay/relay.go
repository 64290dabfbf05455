// Package relay moves completion events from the Postgres outbox to the broker: woken by the
// settlement transaction's NOTIFY and by a scheduled pass, it claims unrelayed events with SKIP
// LOCKED, publishes them with confirms, and marks the confirmed ones relayed.
package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/execution"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

const (
	batchSize = 500
	claimTTL  = 30 * time.Second
)

// Publisher is the part of the message port the relay uses.
type Publisher interface {
	PublishAll(ctx context.Context, route string, msgs []mq.Outgoing) []error
}

// Relay publishes outbox events.
type Relay struct {
	store      *store.Store
	pub        Publisher
	log        *zap.Logger
	interval   time.Duration
	staleAfter time.Duration
	// lastStaleCheck is when the overdue-notice check last ran: it runs on the scheduled pass at
	// most every staleCheckEvery, not on every NOTIFY, which is the hot path.
	lastStaleCheck time.Time
}

// staleCheckEvery is the most often the relay looks for overdue notices; they are overdue by
// minutes, so looking more often finds nothing more.
const staleCheckEvery = 30 * time.Second

// New returns a Relay. A pending event whose notice is overdue by staleAfter is published again
// (see store.EventReleaseStale).
func New(st *store.Store, pub Publisher, log *zap.Logger, interval, staleAfter time.Duration) *Relay {
	return &Relay{store: st, pub: pub, log: log, interval: interval, staleAfter: staleAfter}
}

// Run relays until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	go r.listen(ctx, wake)
	ticker := time.NewTicker(r.interval)
	defer ticker.Stop()
	for {
		if err := r.pass(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("relay pass failed", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-wake:
		}
	}
}

// listen turns NOTIFYs into wake-ups; if the connection fails, the scheduled pass carries on
// alone until it is back.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		if err := r.listenOnce(ctx, r.store.Pool(), wake); err != nil && ctx.Err() == nil {
			r.log.Warn("event notifications lost; relying on the scheduled pass", zap.Error(err))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, pool *pgxpool.Pool, wake chan<- struct{}) error {
	pooled, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire listen connection: %w", err)
	}
	// A LISTENing connection must not go back to the pool: take it out, and close it after.
	conn := pooled.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+execution.EventsNotifyChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

func (r *Relay) pass(ctx context.Context) error {
	if time.Since(r.lastStaleCheck) >= min(staleCheckEvery, r.staleAfter) {
		released, err := r.store.EventReleaseStale(ctx, r.staleAfter)
		if err != nil {
			return err
		}
		r.lastStaleCheck = time.Now()
		if released > 0 {
			r.log.Warn("event notices overdue; publishing them again", zap.Int64("events", released))
		}
	}
	for {
		claimed, err := r.store.EventClaimUnrelayed(ctx, batchSize, claimTTL)
		if err != nil || len(claimed) == 0 {
			return err
		}
		msgs := make([]mq.Outgoing, len(claimed))
		for i, c := range claimed {
			body, err := proto.Marshal(&queuev1.EventNotice{EventId: c.ID, ApplicationId: c.ApplicationID})
			if err != nil {
				return fmt.Errorf("encode event notice: %w", err)
			}
			msgs[i] = mq.Outgoing{ID: c.ID, Body: body}
		}
		var done []string
		for i, err := range r.pub.PublishAll(ctx, routes.Events.Name, msgs) {
			if err != nil {
				r.log.Warn("event publish not confirmed", zap.String("event_id", claimed[i].ID), zap.Error(err))
				continue
			}
			done = append(done, claimed[i].ID)
		}
		if len(done) > 0 {
			if err := r.store.EventMarkRelayed(ctx, done, claimed[0].ClaimedUntil); err != nil {
				return err
			}
		}
		if len(claimed) < batchSize {
			return nil
		}
	}
}
