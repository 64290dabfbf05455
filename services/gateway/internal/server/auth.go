package server

import (
	"context"
	"crypto/subtle"
	"errors"

	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/apperr"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

type applicationKey struct{}

type operatorKey struct{}

// operatorMethods are the calls the admin token may make: reads of any application's data.
var operatorMethods = map[string]bool{
	gatewayv1.GatewayService_GetExecutionTimeline_FullMethodName: true,
}

// isOperator tells a call made with the admin token.
func isOperator(ctx context.Context) bool {
	op, _ := ctx.Value(operatorKey{}).(bool)
	return op
}

// AuthInterceptor authenticates every GatewayService call with one of the application's API keys
// and puts the application id in the context. Health and reflection calls pass through.
//
// A generated key (pkg/apikey) is checked offline first — a typo or a forgery fails its checksum
// and is refused without a database read — then found by its key id and its hash compared in
// constant time; any other token is a key an operator chose for the catalog, found by its hash.
// Lookups are cached (INTEGRATIONS_GATEWAY_CACHE_TTL): a revoked key keeps working on a replica
// for at most that long. A key's use is recorded asynchronously (store.Touch).
//
// adminToken (the deployment's INTEGRATIONS_ADMIN_TOKEN; none or empty: no operator) is also
// taken, for the operator's reads that span applications (operatorMethods) and for nothing else.
func AuthInterceptor(st *store.Store, adminToken ...string) grpc.UnaryServerInterceptor {
	admin := ""
	if len(adminToken) > 0 {
		admin = adminToken[0]
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := info.Server.(*Server); !ok {
			return handler(ctx, req)
		}
		token, err := grpcx.BearerToken(ctx)
		if err != nil {
			return nil, err
		}
		if admin != "" && subtle.ConstantTimeCompare([]byte(token), []byte(admin)) == 1 {
			if !operatorMethods[info.FullMethod] {
				return nil, apperr.New(apperr.KindPermissionDenied, "OPERATOR_READ_ONLY", "the admin token reads execution timelines only; call %s with an application's API key", info.FullMethod)
			}
			return handler(context.WithValue(ctx, operatorKey{}, true), req)
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
