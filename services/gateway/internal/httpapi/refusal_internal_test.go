package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
)

// The precheck's rate-limit refusal is the answer errorHandler gives the same refusal from the
// gRPC server: status, headers and JSON alike.
func TestWriteRateLimitedAnswersAsTheErrorHandler(t *testing.T) {
	mux := runtime.NewServeMux(runtime.WithErrorHandler(errorHandler), runtime.WithMarshalerOption(runtime.MIMEWildcard, restMarshaler()))
	for _, retryAfter := range []time.Duration{time.Millisecond, 100 * time.Millisecond, 2497673469 * time.Nanosecond, 3 * time.Second} {
		for _, kind := range []ratelimit.Kind{ratelimit.Invoke, ratelimit.Read} {
			refusal := server.RateLimited(kind, ratelimit.Decision{RetryAfter: retryAfter, Limit: ratelimit.Limit{PerSecond: 0.4, Burst: 1}})

			fast := httptest.NewRecorder()
			require.True(t, writeRateLimited(fast, refusal))

			slow := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/v1/capabilities/x:invoke", nil)
			_, m := runtime.MarshalerForRequest(mux, r)
			errorHandler(r.Context(), mux, m, slow, r, grpcx.ToStatus(refusal).Err())

			require.Equal(t, http.StatusTooManyRequests, fast.Code)
			require.Equal(t, slow.Code, fast.Code)
			for _, h := range []string{"Retry-After", "Content-Type"} {
				require.Equal(t, slow.Header().Get(h), fast.Header().Get(h), "%s, retry after %s", h, retryAfter)
			}
			var want, got map[string]any
			require.NoError(t, json.Unmarshal(slow.Body.Bytes(), &want))
			require.NoError(t, json.Unmarshal(fast.Body.Bytes(), &got), fast.Body.String())
			require.Equal(t, want, got, "retry after %s", retryAfter)
		}
	}
}

func TestWriteRateLimitedLeavesOtherErrors(t *testing.T) {
	for _, err := range []error{
		errors.New("plain"),
		apperr.Invalid("body", "bad"),
		apperr.New(apperr.KindResourceExhausted, "RATE_LIMITED", "no delay"), // no RetryAfter
		apperr.New(apperr.KindUnavailable, "UNAVAILABLE", "down"),
	} {
		w := httptest.NewRecorder()
		require.False(t, writeRateLimited(w, err), "%v", err)
		require.Zero(t, w.Body.Len())
		require.Empty(t, w.Header())
	}
}

func TestProtoDurationIsProtojsons(t *testing.T) {
	for _, d := range []time.Duration{time.Nanosecond, time.Microsecond, time.Millisecond, 100 * time.Millisecond,
		time.Second, 1500 * time.Millisecond, 2497673469 * time.Nanosecond, time.Hour, 61*time.Second + 10*time.Microsecond} {
		want, err := protojson.Marshal(durationpb.New(d))
		require.NoError(t, err)
		require.Equal(t, string(want), `"`+protoDuration(d)+`"`)
	}
}
