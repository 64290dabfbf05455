// Command settlement writes each execution's final outcome exactly once, with its completion
// event, in one transaction (hop 5 of the flow), and sweeps running executions whose lease expired
// or whose deadline passed.
package main

import (
	"context"

	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/service"
	svcconfig "github.com/integrations-platform/integrations/services/settlement/internal/config"
	"github.com/integrations-platform/integrations/services/settlement/internal/server"
	"github.com/integrations-platform/integrations/services/settlement/internal/store"
	"github.com/integrations-platform/integrations/services/settlement/internal/sweeper"
)

func main() { service.Main("settlement", service.Spec{}, wire) }

func wire(_ context.Context, k *service.Kit, cfg svcconfig.Config) error {
	dispatcherConn, err := k.Dial("dispatcher", cfg.DispatcherAddr)
	if err != nil {
		return err
	}
	st := store.New(k.Pool)
	settlement := server.New(st, dispatcherv1.NewDispatcherServiceClient(dispatcherConn), cfg.Scale, k.Log)
	// Settling is the callers' of the flow only (the sweeper settles in-process, not over gRPC).
	srv := k.InternalServer(grpcx.Policy{
		settlementv1.SettlementService_Settle_FullMethodName:      {"gateway", "execution-consumer", "adapter-callback"},
		settlementv1.SettlementService_FailAttempt_FullMethodName: {"gateway", "execution-consumer", "adapter-callback"},
	})
	settlementv1.RegisterSettlementServiceServer(srv, settlement)
	sw := sweeper.New(st, sweeper.Options{Interval: cfg.SweepInterval, Grace: cfg.SweepGrace, Scale: cfg.Scale, Nudge: settlement.Nudge, Logger: k.Log})
	k.App.Go("sweeper", sw.Run)
	return srv.Run(k.App, "grpc", cfg.GRPCAddr)
}
