package grpcx

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/apperr"
)

// INTERNAL is a bug: logged with its cause. UNAVAILABLE is an outage: logged at warning level.
// A refusal of the request is neither.
func TestErrorInterceptorLogsTheCause(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		err   error
		code  codes.Code
		level zapcore.Level
		msg   string
	}{
		{"a bug", fmt.Errorf("scan execution: %w", errors.New("cannot scan NULL into *string")), codes.Internal, zapcore.ErrorLevel, "internal error"},
		{"a typed bug", apperr.New(apperr.KindInternal, "X", "internal error").Wrap(errors.New("unknown status \"weird\"")), codes.Internal, zapcore.ErrorLevel, "internal error"},
		{"an outage", fmt.Errorf("read execution: %w", syscall.ECONNREFUSED), codes.Unavailable, zapcore.WarnLevel, "dependency unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			core, logs := observer.New(zapcore.DebugLevel)
			icpt := errorInterceptor(zap.New(core))
			_, err := icpt(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/M"},
				func(context.Context, any) (any, error) { return nil, tt.err })
			require.Equal(t, tt.code, status.Code(err))
			entries := logs.All()
			require.Len(t, entries, 1)
			require.Equal(t, tt.level, entries[0].Level)
			require.Equal(t, tt.msg, entries[0].Message)
			require.Contains(t, entries[0].ContextMap()["error"], tt.err.Error(), "the cause is logged")
			require.NotContains(t, status.Convert(err).Message(), tt.err.Error(), "and not answered")
		})
	}

	core, logs := observer.New(zapcore.DebugLevel)
	_, err := errorInterceptor(zap.New(core))(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/M"},
		func(context.Context, any) (any, error) { return nil, apperr.Invalid("id", "not an id") })
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Empty(t, logs.All(), "a refusal is the caller's, not an error of ours")
}

// A refusal is logged at info with its message; a RESOURCE_EXHAUSTED one (a rate limit, refused
// thousands of times a second under a flood) only at debug.
func TestLoggingInterceptorKeepsRateLimitRefusalsAtDebug(t *testing.T) {
	t.Parallel()
	call := func(level zapcore.Level, err error) []observer.LoggedEntry {
		core, logs := observer.New(level)
		_, _ = loggingInterceptor(zap.New(core))(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/M"},
			func(context.Context, any) (any, error) { return nil, ToStatus(err).Err() })
		return logs.All()
	}
	limited := apperr.New(apperr.KindResourceExhausted, "RATE_LIMITED", "invoke rate limit of 5/s for this application exceeded")

	require.Empty(t, call(zapcore.InfoLevel, limited), "at info a rate-limit refusal writes nothing")
	entries := call(zapcore.DebugLevel, limited)
	require.Len(t, entries, 1)
	require.Equal(t, zapcore.DebugLevel, entries[0].Level)
	require.Equal(t, rateLimitedMessage, entries[0].Message)
	require.Contains(t, entries[0].ContextMap()["message"], "invoke rate limit of 5/s")

	entries = call(zapcore.InfoLevel, apperr.Invalid("id", "not an id"))
	require.Len(t, entries, 1, "other refusals are still logged at info")
	require.Equal(t, zapcore.InfoLevel, entries[0].Level)
}

// A burst of refusals (made-up keys, thousands a second) writes a bounded number of lines: the
// first ones, then one in refusalSampleThereafter, each saying how many were left out before it.
func TestLoggingInterceptorSamplesRefusalBursts(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zapcore.InfoLevel)
	intercept := loggingInterceptor(zap.New(core))
	const burst = 1000
	for range burst {
		_, _ = intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/M"},
			func(context.Context, any) (any, error) {
				return nil, ToStatus(apperr.New(apperr.KindUnauthenticated, "UNAUTHENTICATED", "unknown API key")).Err()
			})
	}
	entries := logs.All()
	// Within one tick: refusalSampleFirst, then one per refusalSampleThereafter. A burst that
	// straddles a tick boundary may write one more first batch.
	require.GreaterOrEqual(t, len(entries), refusalSampleFirst, "the first refusals are written")
	require.LessOrEqual(t, len(entries), 2*refusalSampleFirst+burst/refusalSampleThereafter+1, "a burst writes a bounded number of lines")
	for i, e := range entries[:refusalSampleFirst] {
		require.Equal(t, unauthenticatedMessage, e.Message)
		require.Equal(t, int64(0), e.ContextMap()["refusals_dropped"], "line %d: nothing dropped before the first lines", i)
	}
	var written, dropped int64
	for _, e := range entries {
		written++
		dropped += e.ContextMap()["refusals_dropped"].(int64)
	}
	require.Positive(t, dropped, "the written lines count the dropped ones")
	require.LessOrEqual(t, written+dropped, int64(burst))

	// Failures are never sampled away.
	core, logs = observer.New(zapcore.InfoLevel)
	intercept = loggingInterceptor(zap.New(core))
	for range 50 {
		_, _ = intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/M"},
			func(context.Context, any) (any, error) { return nil, ToStatus(errors.New("boom")).Err() })
	}
	require.Len(t, logs.All(), 50)

	// A flood of made-up keys does not thin the other refusals: a passed deadline, a bad
	// argument, a wrong identity are each written.
	core, logs = observer.New(zapcore.InfoLevel)
	intercept = loggingInterceptor(zap.New(core))
	for range burst {
		_, _ = intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/M"},
			func(context.Context, any) (any, error) {
				return nil, ToStatus(apperr.New(apperr.KindUnauthenticated, "UNAUTHENTICATED", "unknown API key")).Err()
			})
	}
	for _, code := range []codes.Code{codes.DeadlineExceeded, codes.InvalidArgument, codes.PermissionDenied, codes.Unimplemented, codes.NotFound} {
		_, _ = intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/M"},
			func(context.Context, any) (any, error) { return nil, status.Error(code, "refused") })
	}
	var others int
	for _, e := range logs.All() {
		if e.Message == "grpc call refused" {
			others++
		}
	}
	require.Equal(t, 5, others, "every other refusal is written beside a sampled flood")
}
