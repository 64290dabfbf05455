package adapter

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
