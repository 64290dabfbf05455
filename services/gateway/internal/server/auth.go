package server

import (
	"context"
	"errors"

	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

type applicationKey struct{}

// AuthInterceptor authenticates every GatewayService call with the application's API key and
// puts the application id in the context. Health and reflection calls pass through.
func AuthInterceptor(st *store.Store) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := info.Server.(*Server); !ok {
			return handler(ctx, req)
		}
		key, err := grpcx.BearerToken(ctx)
		if err != nil {
			return nil, err
		}
		appID, err := st.ApplicationIDByKeyHash(ctx, secret.Hash(key))
		if errors.Is(err, store.ErrNotFound) {
			return nil, apperr.Unauthenticated("unknown API key")
		}
		if err != nil {
			return nil, err
		}
		return handler(context.WithValue(ctx, applicationKey{}, appID), req)
	}
}

func applicationID(ctx context.Context) string {
	id, _ := ctx.Value(applicationKey{}).(string)
	return id
}
