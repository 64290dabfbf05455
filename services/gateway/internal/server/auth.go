package server

import (
	"context"
	"crypto/subtle"
	"errors"

	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/apperr"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/gateway/internal/audit"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

type applicationKey struct{}

type operatorKey struct{}

// operatorMethods are the calls the admin token may make: reads of any application's
// executions and events, and what an on-call engineer does about them — redeliver or redrive
// events, cancel an execution. Nothing that changes an application's configuration (consumer,
// signing secret, keys) nor starts work (invoke).
var operatorMethods = map[string]bool{
	gatewayv1.GatewayService_GetExecutionTimeline_FullMethodName: true,
	gatewayv1.GatewayService_ListExecutions_FullMethodName:       true,
	gatewayv1.GatewayService_ListEvents_FullMethodName:           true,
	gatewayv1.GatewayService_GetEvent_FullMethodName:             true,
	gatewayv1.GatewayService_RedeliverEvent_FullMethodName:       true,
	gatewayv1.GatewayService_RedriveEvents_FullMethodName:        true,
	gatewayv1.GatewayService_CancelExecution_FullMethodName:      true,
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
// admin (the deployment's INTEGRATIONS_ADMIN_TOKEN; empty: no operator) is also taken, for the
// operator's calls that span applications (operatorMethods) and for nothing else.
//
// Failed authentications are limited by fails (nil: not limited) per source address — the call's
// TCP peer — and presented key id: a source or key id over its limit is refused
// RESOURCE_EXHAUSTED with a RetryInfo before its token is verified (docs/decisions.md, "Failed
// authentications are limited (issue 23)"). A REST call, served in process, carries its HTTP
// connection's peer (ratelimit.WithSource).
func AuthInterceptor(st *store.Store, fails *ratelimit.Failures, admin string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := info.Server.(*Server); !ok {
			return handler(ctx, req)
		}
		token, err := grpcx.BearerToken(ctx)
		if err != nil {
			return nil, err
		}
		var operator bool
		var appID string
		err = fails.Guard(ctx, ratelimit.SourceOf(ctx), token, func() error {
			if admin != "" && subtle.ConstantTimeCompare([]byte(token), []byte(admin)) == 1 {
				operator = true
				return nil
			}
			appID, err = authenticate(ctx, st, token)
			return err
		})
		if err != nil {
			return nil, err
		}
		if operator {
			if !operatorMethods[info.FullMethod] {
				return nil, apperr.New(apperr.KindPermissionDenied, errorsv1.ErrorReason_OPERATOR_READ_ONLY.String(), "the admin token reads executions and events, redelivers events and cancels executions only; call %s with an application's API key", info.FullMethod)
			}
			return handler(context.WithValue(ctx, operatorKey{}, true), req)
		}
		return handler(context.WithValue(ctx, applicationKey{}, appID), req)
	}
}

// authenticate returns the application token belongs to. Its refusals never echo the token.
func authenticate(ctx context.Context, st *store.Store, token string) (string, error) {
	app, _, err := AuthenticateKey(ctx, st, token)
	return app, err
}

// KeyRef names the API key a console session was opened with, without the key: the key id of
// a generated key ("" for a chosen one) and the key's hash, enough to find its record again
// and so to end the session when the key is revoked or expires.
type KeyRef struct {
	KeyID string `json:"k,omitempty"`
	Hash  []byte `json:"h"`
}

// AuthenticateKey checks token as every API call is checked and returns its application and a
// KeyRef to check it again by (ReauthenticateKey). Its refusals never echo the token.
func AuthenticateKey(ctx context.Context, st *store.Store, token string) (string, KeyRef, error) {
	if len(token) > apikey.MaxTokenLen {
		return "", KeyRef{}, apperr.Unauthenticated("malformed API key: longer than %d characters", apikey.MaxTokenLen)
	}
	if !apikey.PrintableASCII(token) {
		return "", KeyRef{}, apperr.Unauthenticated("malformed API key: only printable ASCII characters are allowed")
	}
	ref := KeyRef{Hash: apikey.Hash(token)}
	key, err := apikey.Parse(token)
	switch {
	case err == nil:
		ref.KeyID = key.ID
	case errors.Is(err, apikey.ErrNotGenerated):
	default:
		return "", KeyRef{}, apperr.Unauthenticated("malformed API key: its checksum does not match (copied incompletely?)")
	}
	app, err := ReauthenticateKey(ctx, st, ref)
	return app, ref, err
}

// ReauthenticateKey returns the application of the key ref names, refused as the key itself
// would be (unknown, revoked, expired).
func ReauthenticateKey(ctx context.Context, st *store.Store, ref KeyRef) (string, error) {
	var rec *store.KeyRecord
	var err error
	if ref.KeyID != "" {
		rec, err = st.KeyForGenerated(ctx, ref.KeyID, ref.Hash)
	} else {
		rec, err = st.KeyForChosen(ctx, ref.Hash)
	}
	if errors.Is(err, store.ErrNotFound) {
		return "", apperr.Unauthenticated("unknown API key")
	}
	if err != nil {
		return "", err
	}
	switch {
	case subtle.ConstantTimeCompare(rec.Hash, ref.Hash) != 1:
		return "", apperr.Unauthenticated("unknown API key")
	case rec.Revoked:
		return "", apperr.Unauthenticated("API key revoked")
	case rec.Expired():
		return "", apperr.Unauthenticated("API key expired")
	}
	st.Touch(rec.ID)
	return rec.ApplicationID, nil
}

// AsApplication is ctx as a call authenticated for appID, for a caller in this process that
// authenticated the application itself (the console, by its session): the Server's methods then
// apply the application's tenancy exactly as to a call over the API.
func AsApplication(ctx context.Context, appID string) context.Context {
	return context.WithValue(ctx, applicationKey{}, appID)
}

// AsOperator is ctx as a call made with the admin token, for a caller in this process that
// checked the token itself (the console): only the operator's calls (operatorMethods) are meant
// to be called with it.
func AsOperator(ctx context.Context) context.Context {
	return context.WithValue(ctx, operatorKey{}, true)
}

// auditEntry is the audit entry of an action ctx's caller takes: the operator or the application,
// through the surface ctx came from.
func auditEntry(ctx context.Context, action, target string, detail map[string]any) store.Audit {
	who := audit.Application(applicationID(ctx))
	if isOperator(ctx) {
		who = audit.Operator
	}
	return store.Audit{Who: who, Via: audit.Via(ctx), Action: action, Target: target, Detail: detail}
}

func applicationID(ctx context.Context) string {
	id, _ := ctx.Value(applicationKey{}).(string)
	return id
}

// callerScope is the application whose data a call by id reads or changes: the caller's own, or
// for the operator (admin token) any application's (store.AnyApplication).
func callerScope(ctx context.Context) (string, error) {
	if isOperator(ctx) {
		return store.AnyApplication, nil
	}
	app := applicationID(ctx)
	if app == "" {
		// Never the operator's view by accident: an application call always names its application.
		return "", apperr.Unauthenticated("no application for this call")
	}
	return app, nil
}
