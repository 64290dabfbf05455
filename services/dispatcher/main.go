// Command dispatcher moves dispatch records from Postgres to the executions queue (hop 2 of the
// flow): claimed with SKIP LOCKED and a claim expiry once they are due within the route's largest
// delay level, published into the delay level that holds each until it is due, with publisher
// confirms, deleted once confirmed. It passes on a schedule, when the next record comes within
// reach, and when the gateway or settlement nudges it.
package main

import (
	"context"
	"time"

	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/service"
	svcconfig "github.com/integrations-platform/integrations/services/dispatcher/internal/config"
	"github.com/integrations-platform/integrations/services/dispatcher/internal/dispatch"
	"github.com/integrations-platform/integrations/services/dispatcher/internal/store"
)

// The dispatcher writes only claims and deletions of published records: losing them in a Postgres
// crash publishes a dispatch twice, which the consumer's compare makes harmless, so its commits do
// not wait for the disk (AsyncCommit).
func main() {
	service.Main("dispatcher", service.Spec{Routes: []mq.Route{routes.Executions}, AsyncCommit: true}, wire)
}

func wire(_ context.Context, k *service.Kit, cfg svcconfig.Config) error {
	// Records due within the largest delay level are published into the broker's holding queues;
	// later ones wait in Postgres.
	var horizon time.Duration
	if levels := k.Broker.DelayLevels(routes.Executions.Name); len(levels) > 0 {
		horizon = levels[len(levels)-1]
	}
	d := dispatch.New(store.New(k.Pool), k.Broker, k.Log, dispatch.Config{
		Interval: cfg.Interval, ClaimTTL: cfg.ClaimTTL, Horizon: horizon, BatchSize: cfg.BatchSize,
	})
	// Nudged by the gateway (a new dispatch), settlement (a next attempt) and the consumer (a
	// dispatch rescheduled after its adapter was unreachable).
	srv := k.InternalServer(grpcx.Policy{
		dispatcherv1.DispatcherService_Nudge_FullMethodName: {"gateway", "settlement", "execution-consumer"},
	})
	dispatcherv1.RegisterDispatcherServiceServer(srv, d)
	k.App.Go("dispatch-loop", d.Run)
	k.App.Go("dead-letter recovery", dispatch.NewRecoverer(store.New(k.Pool), k.Broker, k.Log, cfg.RecoverEvery()).Run)
	return srv.Run(k.App, "grpc", cfg.GRPCAddr)
}
