// Command execution-consumer runs async attempts (hop 3 of the flow): it takes dispatch messages
// from the executions queue, starts each attempt with one compare of status and attempt number,
// calls the adapter, and reports the outcome to the settlement service.
package main

import (
	"context"

	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/nudge"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/service"
	"github.com/integrations-platform/integrations/services/execution-consumer/internal/attempt"
	svcconfig "github.com/integrations-platform/integrations/services/execution-consumer/internal/config"
	"github.com/integrations-platform/integrations/services/execution-consumer/internal/store"
)

func main() {
	service.Main("execution-consumer", service.Spec{Routes: []mq.Route{routes.Executions}}, wire)
}

func wire(_ context.Context, k *service.Kit, cfg svcconfig.Config) error {
	settlementConn, err := k.Dial("settlement", cfg.SettlementAddr)
	if err != nil {
		return err
	}
	dispatcherConn, err := k.Dial("dispatcher", cfg.DispatcherAddr)
	if err != nil {
		return err
	}
	adapters, err := k.Adapters(cfg.Platform)
	if err != nil {
		return err
	}
	// An arrival early by less than the delay tolerance, time-scaled as the other delays are
	// (50 ms unscaled), starts its attempt rather than being held or deferred for the rest. Not
	// the broker's floored tolerance (at least 5 ms): that one only makes a message arrive late,
	// and in a time-scaled run 5 ms is a large part of a scaled retry delay.
	st := store.New(k.Pool).WithEarlyTolerance(cfg.Scale(mq.DelayTolerance))
	handler := attempt.New(st, adapters, settlementv1.NewSettlementServiceClient(settlementConn), cfg.Scale, k.Log).
		WithNudge(nudge.Dispatcher(dispatcherv1.NewDispatcherServiceClient(dispatcherConn), k.Log))

	// Health only: the empty Policy refuses every other method.
	srv := k.InternalServer(grpcx.Policy{})
	// On SIGTERM, after the drain window, the consumer stops taking dispatches and the attempts
	// in flight — adapter calls included — finish until the soft timeout: a deploy neither cuts an
	// adapter call nor leaves an attempt to wait out its lease.
	k.App.Drain("consume-executions", func(take, work context.Context) error {
		return k.Broker.Consume(take, routes.Executions.Name, cfg.Concurrency, handler.Handle, mq.Drain(work, k.App.Grace()))
	})
	return srv.Run(k.App, "grpc", cfg.GRPCAddr)
}
