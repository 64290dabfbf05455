package adapter

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The platform may grant less than the lease asked for (the capability's lease caps it, and so
// does the execution's deadline): renewals must then follow the lease granted, or it would expire
// between two of them.
func TestRenewEveryFollowsTheLeaseGranted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		asked, granted time.Duration
		want           time.Duration
	}{
		{name: "nothing granted yet", asked: 3 * time.Minute, want: time.Minute},
		{name: "granted as asked", asked: 3 * time.Minute, granted: 3 * time.Minute, want: time.Minute},
		{name: "granted less", asked: 30 * time.Minute, granted: 3 * time.Minute, want: time.Minute},
		{name: "granted more is not trusted", asked: 3 * time.Minute, granted: time.Hour, want: time.Minute},
		{name: "near the deadline, bounded below", asked: 3 * time.Minute, granted: 3 * time.Millisecond, want: minRenewEvery},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cb := &Callbacks{}
			cb.lease.Store(int64(tt.asked))
			cb.granted.Store(int64(tt.granted))
			require.Equal(t, tt.want, cb.renewEvery())
		})
	}
}
