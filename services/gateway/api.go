package main

import (
	"context"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/service"
	svcconfig "github.com/integrations-platform/integrations/services/gateway/internal/config"
	"github.com/integrations-platform/integrations/services/gateway/internal/httpapi"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// api is the client applications' API: the gateway service, served over gRPC and, in process,
// over REST, behind the API keys and the rate limits.
type api struct {
	store *store.Store
	gw    *server.Server
	grpc  *grpcx.Server
	gate  *server.RateGate
	// fails counts failed authentications on every surface that takes a credential (gRPC, REST,
	// the console's sign-in, the operator endpoints).
	fails *ratelimit.Failures
}

// wireAPI builds the API and registers its background work and its shutdown on k.App.
func wireAPI(ctx context.Context, k *service.Kit, cfg svcconfig.Config) (*api, error) {
	dispatcherConn, err := k.Dial("dispatcher", cfg.DispatcherAddr)
	if err != nil {
		return nil, err
	}
	settlementConn, err := k.Dial("settlement", cfg.SettlementAddr)
	if err != nil {
		return nil, err
	}
	adapters, err := k.Adapters(cfg.Platform)
	if err != nil {
		return nil, err
	}
	st, err := keyStore(ctx, k, cfg)
	if err != nil {
		return nil, err
	}
	a := &api{store: st}
	a.limit(ctx, k, cfg)
	// The gRPC limit leaves room for the envelope around a payload of the largest size allowed,
	// so that an oversized payload is refused by validation with a message naming the field.
	a.grpc = k.PublicServer(grpcx.ServerConfig{
		MaxRecvMsgSize: 2*cfg.MaxPayloadBytes + 64<<10,
		// A call over its limit is held (and one waiting for its token waits): the bound per
		// connection keeps one connection firing calls without waiting from piling them up.
		MaxConcurrentStreams: 1000,
		Interceptors:         []grpc.UnaryServerInterceptor{server.AuthInterceptor(st, a.fails, cfg.AdminToken), a.gate.Interceptor()},
	})
	a.gw = server.New(st, adapters,
		dispatcherv1.NewDispatcherServiceClient(dispatcherConn), settlementv1.NewSettlementServiceClient(settlementConn),
		k.Box, server.Options{
			MaxPayloadBytes:     cfg.MaxPayloadBytes,
			Scale:               cfg.Scale,
			WebhookAllowHTTP:    cfg.WebhookAllowHTTP,
			WebhookAllowPrivate: cfg.WebhookAllowPrivate,
			WebhookDeny:         cfg.WebhookDeny(),
			// The courtesy check of consumer names. Go's own resolver, as the event router's:
			// names are looked up rooted ("name."), and Go matches a rooted name to its
			// /etc/hosts entry where the C library's resolver does not.
			Resolver: &net.Resolver{PreferGo: true},
			// Not scaled: receivers switch secrets on the wall clock.
			SecretRotationOverlap: cfg.SecretRotationOverlap,
		}, k.Log)
	gatewayv1.RegisterGatewayServiceServer(a.grpc, a.gw)
	a.drainSyncCalls(k)
	return a, nil
}

// keyStore is the store, with the API keys' cache and their last use written in the background,
// once the catalog's keys have been judged: a weak one stops the gateway off loopback.
func keyStore(ctx context.Context, k *service.Kit, cfg svcconfig.Config) (*store.Store, error) {
	// A key's last use is written at most once a minute per key and replica, off the accept path.
	st := store.New(k.Pool).WithCache(cfg.CacheTTL).WithLastUsed(time.Minute)
	// Catalog keys are judged by catalog apply, where they are seen in clear; the rule is the
	// admin token's.
	weakApps, unjudged, err := st.CatalogKeyStrength(ctx)
	if err != nil {
		return nil, err
	}
	warning, err := cfg.CheckCatalogKeys(weakApps)
	if err != nil {
		return nil, err
	}
	if warning != "" {
		k.Log.Warn("weak catalog key allowed on loopback", zap.String("problem", warning))
	}
	// A key declared by its hash is never judged: the operator is told which ones at each start.
	if len(unjudged) > 0 {
		k.Log.Warn("catalog keys of unknown strength: declared by their hash (or applied before migration 00021), never seen in clear; make sure each is 32 random bytes",
			zap.Strings("applications", unjudged))
	}
	k.App.Go("api-key-last-used", func(ctx context.Context) error { return st.RunLastUsed(ctx, k.Log) })
	return st, nil
}

// limit sets up the rate limits and the count of failed authentications.
func (a *api) limit(ctx context.Context, k *service.Kit, cfg svcconfig.Config) {
	// Rate limits: each replica holds limit ÷ live replicas, counted by a heartbeat (beaten once
	// here so that a replica joining a running fleet starts with its share, not the whole limit).
	replicas := ratelimit.NewReplicas(k.Pool, cfg.RateLimitHeartbeat, k.Log)
	if err := replicas.Beat(ctx); err != nil {
		k.Log.Warn("rate limits: replicas not counted yet", zap.Error(err))
	}
	k.App.Go("replica-heartbeat", func(ctx context.Context) error { replicas.Run(ctx); return nil })
	limiter := ratelimit.New(ratelimit.NewSource(k.Pool, cfg.RateLimits(), cfg.CacheTTL).Limits, replicas.Count)
	a.gate = server.NewRateGate(limiter, cfg.RateLimitRefusalDelay, server.MaxHeldPerApplication)
	// Failed authentications, counted per source address and key id by every surface that takes
	// a credential (gRPC, REST, the console's sign-in, the operator endpoints), each replica
	// holding its share like the rate limits.
	a.fails = ratelimit.NewFailures(cfg.AuthFailureBurst, cfg.AuthFailureWindow, replicas.Count, k.Log)
}

// drainSyncCalls registers the shutdown of sync calls. They are served through the drain window;
// after it new ones are refused with a retryable UNAVAILABLE (the client goes to another
// replica), and the calls in flight and their outcome reports are awaited until the soft timeout
// — a worker's in-flight work — and then, as the first closer, until the hard timeout, before the
// settlement connection closes. A sync timeout longer than INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT cuts
// nothing: its report is still awaited, up to INTEGRATIONS_SHUTDOWN_TIMEOUT.
func (a *api) drainSyncCalls(k *service.Kit) {
	k.App.Drain("sync-calls", func(take, work context.Context) error {
		<-take.Done()
		a.gw.StopSync()
		_ = a.gw.WaitSync(work)
		return nil
	})
	k.App.CloseContext("sync-reports", a.gw.WaitSync)
}

// serveREST serves the API's REST face, with the extra handlers (the operator endpoints and the
// console) beside it.
func (a *api) serveREST(ctx context.Context, k *service.Kit, cfg svcconfig.Config, extra map[string]http.Handler) error {
	return httpapi.Run(ctx, k.App, k.Log, httpapi.InProcess(a.gw, a.grpc.Unary()), httpapi.Config{
		Addr: cfg.HTTPAddr, MaxBodyBytes: int64(2*cfg.MaxPayloadBytes + 64<<10),
		ReadHeaderTimeout: cfg.HTTPReadHeaderTimeout, ReadTimeout: cfg.HTTPReadTimeout,
		WriteTimeout: cfg.HTTPWriteTimeout, IdleTimeout: cfg.HTTPIdleTimeout,
		TLS: k.Public,
		// A request over its rate limit is refused before its body is decoded.
		Precheck: a.gate.Precheck(a.store, a.fails),
		Extra:    extra,
	})
}
