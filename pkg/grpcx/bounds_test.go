package grpcx

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/apperr"
)

// A refusal quoting megabytes of input, or an internal error carrying them, is logged bounded.
func TestLogsBoundMessages(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("x", 1<<20)
	for name, err := range map[string]error{
		"refusal":  apperr.Invalid("capability", "%s is not a capability name", huge),
		"internal": errors.New("scan: " + huge),
	} {
		core, logs := observer.New(zapcore.DebugLevel)
		log := zap.New(core)
		chain := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return loggingInterceptor(log)(ctx, req, info, func(ctx context.Context, req any) (any, error) {
				return errorInterceptor(log)(ctx, req, info, h)
			})
		}
		_, _ = chain(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/M"},
			func(context.Context, any) (any, error) { return nil, err })
		require.NotEmpty(t, logs.All(), name)
		for _, e := range logs.All() {
			for k, v := range e.ContextMap() {
				if s, ok := v.(string); ok {
					require.LessOrEqual(t, len(s), logMessageMax, "%s: %s", name, k)
				}
			}
		}
	}
}

func TestReflectionOnlyWhenConfigured(t *testing.T) {
	t.Parallel()
	const svc = "grpc.reflection.v1.ServerReflection"
	// NewServer starts the server's pool of call goroutines: stopped, even a server never served
	// lets them go.
	off := NewServer(ServerConfig{})
	t.Cleanup(off.Stop)
	require.NotContains(t, off.GetServiceInfo(), svc)
	on := NewServer(ServerConfig{Reflection: true})
	t.Cleanup(on.Stop)
	require.Contains(t, on.GetServiceInfo(), svc)
}
