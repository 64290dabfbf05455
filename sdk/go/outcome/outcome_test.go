package outcome_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/sdk/go/outcome"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want outcome.Class
	}{
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), outcome.Retry},
		{"deadline", status.Error(codes.DeadlineExceeded, "deadline"), outcome.Retry},
		{"resource exhausted", status.Error(codes.ResourceExhausted, "busy"), outcome.Retry},
		{"internal from a transport", status.Error(codes.Internal, "stream reset"), outcome.Retry},
		{"unknown", status.Error(codes.Unknown, "?"), outcome.Retry},
		{"aborted conflict", status.Error(codes.Aborted, "serialization"), outcome.Retry},
		{"plain context deadline", context.DeadlineExceeded, outcome.Retry},
		{"already settled", withReason(codes.FailedPrecondition, "ALREADY_SETTLED"), outcome.ClassMovedOn},
		{"stale attempt", withReason(codes.Aborted, "STALE_ATTEMPT"), outcome.ClassMovedOn},
		{"not found", status.Error(codes.NotFound, "gone"), outcome.ClassMovedOn},
		{"no longer applicable", withReason(codes.FailedPrecondition, "NO_LONGER_APPLICABLE"), outcome.ClassMovedOn},
		{"result refused", badField("result"), outcome.ClassResultRefused},
		{"other field refused", badField("execution_id"), outcome.ClassRefused},
		{"unauthenticated", status.Error(codes.Unauthenticated, "bad token"), outcome.ClassRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, outcome.Classify(tt.err))
		})
	}
}

func TestDoRetriesUntilRecorded(t *testing.T) {
	t.Parallel()
	tries := 0
	v, err := outcome.Do(context.Background(), outcome.Options{Until: time.Now().Add(5 * time.Second), InitialInterval: time.Millisecond},
		func(context.Context) error {
			tries++
			if tries < 4 {
				return status.Error([]codes.Code{codes.Unavailable, codes.Internal, codes.DeadlineExceeded}[tries-1], "down")
			}
			return nil
		})
	require.NoError(t, err)
	require.Equal(t, outcome.Recorded, v)
	require.Equal(t, 4, tries)
}

func TestDoRetriesUntilTheDeadlineThenExpires(t *testing.T) {
	t.Parallel()
	until := time.Now().Add(400 * time.Millisecond)
	tries := 0
	v, err := outcome.Do(context.Background(), outcome.Options{Until: until, InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		func(context.Context) error { tries++; return status.Error(codes.Unavailable, "down") })
	require.Equal(t, outcome.Expired, v)
	require.Equal(t, codes.Unavailable, status.Code(err), "the last failure is returned, not the context's")
	// Giving up early is the fault to catch: the lower bound is tight (the backoff's last interval
	// is at most 50 ms), and a loaded machine only makes the end later. The upper bound only says
	// it did give up: a last try run late must not fail the test.
	now := time.Now()
	require.False(t, now.Before(until.Add(-200*time.Millisecond)), "retried up to the deadline, not fewer times")
	require.True(t, now.Before(until.Add(10*time.Second)), "and gave up at it")
	// At least two tries: it retried. How many fit in the 400 ms depends on the jittered backoff
	// and on how loaded the machine is (4 under -race with other test runs on two cores); the
	// deadline check above is what says it did not give up early.
	require.Greater(t, tries, 1)
}

func TestDoStopsAtOnceOnAFinalAnswer(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err  error
		want outcome.Verdict
	}{
		{withReason(codes.FailedPrecondition, "ALREADY_SETTLED"), outcome.MovedOn},
		{status.Error(codes.Unauthenticated, "no"), outcome.Refused},
		{badField("result"), outcome.ResultRefused},
	} {
		tries := 0
		v, err := outcome.Do(context.Background(), outcome.Options{Until: time.Now().Add(time.Second)},
			func(context.Context) error { tries++; return tt.err })
		require.Equal(t, tt.want, v)
		require.Equal(t, 1, tries)
		if v == outcome.MovedOn {
			require.NoError(t, err, "moved on is not an error")
		} else {
			require.Error(t, err)
		}
	}
}

// withReason is a status as the platform answers a refusal with a reason: code, and an ErrorInfo.
func withReason(c codes.Code, reason string) error {
	st, err := status.New(c, strings.ToLower(reason)).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "integrations"})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// badField is INVALID_ARGUMENT naming field in a BadRequest.
func badField(field string) error {
	st, err := status.New(codes.InvalidArgument, field+": invalid").WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: "invalid"}}})
	if err != nil {
		panic(err)
	}
	return st.Err()
}
