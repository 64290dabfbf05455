package adapter

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// TestRefusalSampler: one line per refusalEvery, the next one counting those left out.
func TestRefusalSampler(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	r := refusalSampler{now: func() time.Time { return now }}
	ok, n := r.sample()
	require.True(t, ok, "the first refusal is logged")
	require.Zero(t, n)
	for range 1000 {
		now = now.Add(time.Millisecond / 2)
		ok, _ = r.sample()
		require.False(t, ok, "a flood within the second is not")
	}
	now = now.Add(refusalEvery)
	ok, n = r.sample()
	require.True(t, ok)
	require.Equal(t, 1000, n, "the next line counts those not logged")
	now = now.Add(refusalEvery)
	ok, n = r.sample()
	require.True(t, ok)
	require.Zero(t, n)
}

// TestRefusalIsTheMarker: the SDK's refusal is platformtoken.RefusalStatus to the byte, on a
// gRPC server (GRPCStatus), and the platform takes it as a well-formed marker naming the check.
// (pkg/grpcx's tests hold the platform's own server to the same bytes.)
func TestRefusalIsTheMarker(t *testing.T) {
	t.Parallel()
	for _, why := range []error{platformtoken.ErrMissing, platformtoken.ErrKey, platformtoken.ErrInvalid,
		platformtoken.ErrAudience, platformtoken.ErrBinding, platformtoken.ErrReplayed} {
		err := fmt.Errorf("%w: %w", platformtoken.ErrRefused, why)
		want := platformtoken.RefusalStatus(err).Proto()
		r := platformtoken.Refuse(err)
		require.True(t, proto.Equal(want, r.GRPCStatus().Proto()), "%v", why)
		require.ErrorIs(t, r, why)
		got := platformtoken.ReadRefusal(r.GRPCStatus().Err(), false)
		require.True(t, got.Marked, "%v", why)
		require.Empty(t, got.Problem, "%v", why)
		require.Equal(t, platformtoken.Check(err), got.Check)
	}
}
