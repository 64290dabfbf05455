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
