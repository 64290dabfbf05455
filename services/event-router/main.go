// Command event-router relays completion events from the Postgres outbox to the broker and
// delivers each to the invoking application's consumer (hop 6 of the flow).
package main

import (
	"context"
	"net"

	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/service"
	svcconfig "github.com/integrations-platform/integrations/services/event-router/internal/config"
	"github.com/integrations-platform/integrations/services/event-router/internal/deliver"
	"github.com/integrations-platform/integrations/services/event-router/internal/relay"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

// Everything the router writes — relay claims and marks, delivery claims, the records of delivery
// attempts — only sends a notice or a webhook again if a Postgres crash loses it (a lost record
// leaves the event pending; receivers deduplicate by webhook-id), so its commits do not wait for
// the disk (AsyncCommit). The events themselves are written durably by the settlement service, in
// the transaction that settles their execution.
func main() {
	service.Main("event-router", service.Spec{Routes: []mq.Route{routes.Events}, AsyncCommit: true}, wire)
}

func wire(_ context.Context, k *service.Kit, cfg svcconfig.Config) error {
	st := store.New(k.Pool)
	// The events route's port-level budget, as the port applies it (floored: routes.BlipFloor),
	// sizes how soon a notice may be taken for lost.
	_, noticeBudget, err := mq.RetryDelays(routes.Events, cfg.TimeScale)
	if err != nil {
		return err
	}
	levels := k.Broker.DelayLevels(routes.Events.Name)
	del := deliver.New(st, k.Box, deliver.Config{
		Delays:       cfg.ScaledRetryDelays(),
		Timeout:      cfg.DeliveryTimeout,
		AllowPrivate: cfg.WebhookAllowPrivate,
		Deny:         cfg.WebhookDeny(),
		// Go's own resolver: consumer names are dialled rooted ("name.", never under the search
		// domains), and Go matches a rooted name to its /etc/hosts entry where the C library's
		// resolver does not.
		Resolver:     &net.Resolver{PreferGo: true},
		PerApp:       cfg.PerAppConcurrency,
		Busy:         levels[0],
		BusyPatience: cfg.PerAppPatience,
		TimeScale:    cfg.TimeScale,
	}, k.Log)
	// The relay hands freshly relayed events to this process's deliverer (its claim is their
	// delivery claim): Concurrency workers beside the broker consumer's, a queue of twice that;
	// what does not fit is published as before.
	local := del.Local(k.Broker, routes.Events.Name, 2*cfg.Concurrency)
	rel := relay.New(st, k.Broker, k.Log, relay.Options{
		Handoff:      local,
		Interval:     cfg.RelayInterval,
		StaleAfter:   cfg.StaleAfter(noticeBudget),
		RecoverEvery: cfg.RecoverEvery(),
		DeadLetters:  k.Broker,
		NoticeBudget: noticeBudget,
		ClaimTTL:     cfg.RelayClaimTTL(relay.DefaultClaimTTL),
	})

	// Health only: the empty Policy refuses every other method.
	srv := k.InternalServer(grpcx.Policy{})
	k.App.Go("relay", rel.Run)
	// Deliveries in flight finish (until the soft timeout) rather than being cut and sent again.
	k.App.Drain("deliver", func(take, work context.Context) error {
		return k.Broker.Consume(take, routes.Events.Name, cfg.Concurrency, del.Handle, mq.Drain(work, k.App.Grace()))
	})
	k.App.Drain("deliver in process", func(take, work context.Context) error {
		return local.Run(take, work, cfg.Concurrency)
	})
	k.App.Close("consumer connections", del.Close)
	return srv.Run(k.App, "grpc", cfg.GRPCAddr)
}
