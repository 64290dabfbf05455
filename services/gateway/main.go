// Command gateway is the client applications' entry point (hop 1 of the flow): it validates and
// authenticates invocations, commits async executions with their first dispatch record in one
// transaction, runs sync executions inline, and serves reads — over gRPC and REST.
//
// Its wiring is in three parts: the API (api.go: keys, limits, the gRPC service and its REST
// face), the operator endpoints (system.go) and the console (console.go).
package main

import (
	"context"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/service"
	svcconfig "github.com/integrations-platform/integrations/services/gateway/internal/config"
	"github.com/integrations-platform/integrations/services/gateway/internal/console"
	"github.com/integrations-platform/integrations/services/gateway/internal/system"
)

func main() {
	service.Main("gateway", service.Spec{
		// Every accept is a few round trips on its own connection: pgx's default pool (4 on a
		// 2-core host) capped accept throughput in the benchmark (docs/benchmarks.md), so the
		// gateway defaults to 16.
		MaxConns:         16,
		PlaintextWarning: "calls to settlement and the dispatcher are plaintext",
	}, wire)
}

func wire(ctx context.Context, k *service.Kit, cfg svcconfig.Config) error {
	if warning, _ := cfg.CheckAdminToken(); warning != "" { // off loopback, Validate refused it
		k.Log.Warn("weak admin token allowed on loopback", zap.String("problem", warning))
	}
	a, err := wireAPI(ctx, k, cfg)
	if err != nil {
		return err
	}
	sys := systemConfig(k, cfg, a)
	extra := system.Handlers(sys)
	if extra[console.Prefix], err = consoleHandler(k, cfg, a, sys); err != nil {
		return err
	}
	// REST is registered first so that it stops first, with the gRPC server: both serve gw.
	if err := a.serveREST(ctx, k, cfg, extra); err != nil {
		return err
	}
	return a.grpc.Run(k.App, "grpc", cfg.GRPCAddr)
}
