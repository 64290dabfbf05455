// Command adapter-callback serves the callbacks adapters make for long-running work (hop 4 of the
// flow): lease renewals, progress, and completion.
package main

import (
	"context"

	"google.golang.org/grpc"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/service"
	svcconfig "github.com/integrations-platform/integrations/services/adapter-callback/internal/config"
	"github.com/integrations-platform/integrations/services/adapter-callback/internal/server"
	"github.com/integrations-platform/integrations/services/adapter-callback/internal/store"
)

func main() { service.Main("adapter-callback", service.Spec{}, wire) }

func wire(_ context.Context, k *service.Kit, cfg svcconfig.Config) error {
	settlementConn, err := k.Dial("settlement", cfg.SettlementAddr)
	if err != nil {
		return err
	}
	st := store.New(k.Pool)
	// Client-facing: adapters call it with their credential, over TLS when a certificate is set.
	srv := k.PublicServer(grpcx.ServerConfig{Interceptors: []grpc.UnaryServerInterceptor{server.AuthInterceptor(st)}})
	adapterv1.RegisterAdapterCallbackServiceServer(srv, server.New(st, settlementv1.NewSettlementServiceClient(settlementConn), cfg.Scale, k.Log))
	return srv.Run(k.App, "grpc", cfg.GRPCAddr)
}
