package server

import (
	"context"
	"crypto/subtle"
	"errors"

	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

type applicationKey struct{}

// AuthInterceptor authenticates every GatewayService call with one of the application's API keys
// and puts the application id in the context. Health and reflection calls pass through.
//
// A generated key (pkg/apikey) is checked offline first — a typo or a forgery fails its checksum
// and is refused without a database read — then found by its key id and its hash compared in
// constant time; any other token is a key an operator chose for the catalog, found by its hash.
// Lookups are cached (INTEGRATIONS_GATEWAY_CACHE_TTL): a revoked key keeps working on a replica
// for at most that long. A key's use is recorded asynchronously (store.Touch).
func AuthInterceptor(st *store.Store) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := info.Server.(*Server); !ok {
			return handler(ctx, req)
		}
		token, err := grpcx.BearerToken(ctx)
		if err != nil {
			return nil, err
		}
		appID, err := authenticate(ctx, st, token)
		if err != nil {
			return nil, err
		}
		return handler(context.WithValue(ctx, applicationKey{}, appID), req)
	}
}

// authenticate returns the application token belongs to. Its refusals never echo the token.
func authenticate(ctx context.Context, st *store.Store, token string) (string, error) {
	if len(token) > apikey.MaxTokenLen {
		return "", apperr.Unauthenticated("malformed API key: longer than %d characters", apikey.MaxTokenLen)
	}
	if !apikey.PrintableASCII(token) {
		return "", apperr.Unauthenticated("malformed API key: only printable ASCII characters are allowed")
	}
	hash := apikey.Hash(token)
	var rec *store.KeyRecord
	key, err := apikey.Parse(token)
	switch {
	case err == nil:
		rec, err = st.KeyForGenerated(ctx, key.ID, hash)
	case errors.Is(err, apikey.ErrNotGenerated):
		rec, err = st.KeyForChosen(ctx, hash)
	default:
		return "", apperr.Unauthenticated("malformed API key: its checksum does not match (copied incompletely?)")
	}
	if errors.Is(err, store.ErrNotFound) {
		return "", apperr.Unauthenticated("unknown API key")
	}
	if err != nil {
		return "", err
	}
	switch {
	case subtle.ConstantTimeCompare(rec.Hash, hash) != 1:
		return "", apperr.Unauthenticated("unknown API key")
	case rec.Revoked:
		return "", apperr.Unauthenticated("API key revoked")
	case rec.Expired():
		return "", apperr.Unauthenticated("API key expired")
	}
	st.Touch(rec.ID)
	return rec.ApplicationID, nil
}

func applicationID(ctx context.Context) string {
	id, _ := ctx.Value(applicationKey{}).(string)
	return id
}
