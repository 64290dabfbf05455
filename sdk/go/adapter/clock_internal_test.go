package adapter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
)

// skewedPlatform answers RenewLease like a platform whose clock is an hour ahead of the adapter's.
type skewedPlatform struct {
	adapterv1.AdapterCallbackServiceClient
	lease bool // whether it sends the lease as a duration too
}

func (p skewedPlatform) RenewLease(_ context.Context, in *adapterv1.RenewLeaseRequest, _ ...grpc.CallOption) (*adapterv1.RenewLeaseResponse, error) {
	granted := in.GetLease().AsDuration()
	resp := &adapterv1.RenewLeaseResponse{LeaseExpireTime: timestamppb.New(time.Now().Add(time.Hour + granted))}
	if p.lease {
		resp.Lease = durationpb.New(granted)
	}
	return resp, nil
}

// TestRenewalGoesByTheLeaseGrantedNotTheClock: the SDK schedules renewals by the lease the
// platform says it granted, a duration, not by the expiry time read on the adapter's clock; only
// a platform that sends no duration leaves it to the expiry time.
func TestRenewalGoesByTheLeaseGrantedNotTheClock(t *testing.T) {
	t.Parallel()
	const asked = 3 * time.Minute
	cb := &Callbacks{client: skewedPlatform{lease: true}}
	require.NoError(t, cb.RenewLease(context.Background(), asked))
	require.Equal(t, asked, time.Duration(cb.granted.Load()))
	require.Equal(t, asked/3, cb.renewEvery())
	require.WithinDuration(t, time.Now().Add(asked), time.Unix(0, cb.leaseEnd.Load()), time.Second,
		"the lease's end on this host's clock, for how long an outcome is retried")

	old := &Callbacks{client: skewedPlatform{}}
	require.NoError(t, old.RenewLease(context.Background(), asked))
	require.Greater(t, time.Duration(old.granted.Load()), time.Hour, "an older platform: the expiry time on this clock")
}

// TestRequestDeadlineIsOnThisHostsClock: the handler's deadline is counted on the adapter's clock
// from the time left the platform measured, not read from deadline_time, which is on the
// platform's: a platform an hour behind would otherwise hand every handler a deadline an hour
// gone, and its work would be cancelled at once.
func TestRequestDeadlineIsOnThisHostsClock(t *testing.T) {
	t.Parallel()
	req := newRequest(&adapterv1.ExecuteRequest{
		DeadlineTime: timestamppb.New(time.Now().Add(-time.Hour + time.Minute)),
		DeadlineIn:   durationpb.New(time.Minute),
	})
	require.WithinDuration(t, time.Now().Add(time.Minute), req.Deadline, time.Second)

	old := newRequest(&adapterv1.ExecuteRequest{DeadlineTime: timestamppb.New(time.Unix(1e9, 0))})
	require.True(t, time.Unix(1e9, 0).Equal(old.Deadline), "an older platform: deadline_time as it is")
}
