package rpcstatus_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wire is every reason as the platform has sent it: a client (the TypeScript SDK, a program that
// compares strings) reads these exact words, so a value of ErrorReason is never renamed; a new
// one is added here on purpose.
var wire = map[errorsv1.ErrorReason]string{
	errorsv1.ErrorReason_INVALID_ARGUMENT:          "INVALID_ARGUMENT",
	errorsv1.ErrorReason_NOT_FOUND:                 "NOT_FOUND",
	errorsv1.ErrorReason_UNAUTHENTICATED:           "UNAUTHENTICATED",
	errorsv1.ErrorReason_UNAVAILABLE:               "UNAVAILABLE",
	errorsv1.ErrorReason_INTERNAL:                  "INTERNAL",
	errorsv1.ErrorReason_CANCELLED:                 "CANCELLED",
	errorsv1.ErrorReason_DEADLINE_EXCEEDED:         "DEADLINE_EXCEEDED",
	errorsv1.ErrorReason_ALREADY_SETTLED:           "ALREADY_SETTLED",
	errorsv1.ErrorReason_STALE_ATTEMPT:             "STALE_ATTEMPT",
	errorsv1.ErrorReason_STATUS_MISMATCH:           "STATUS_MISMATCH",
	errorsv1.ErrorReason_NO_LONGER_APPLICABLE:      "NO_LONGER_APPLICABLE",
	errorsv1.ErrorReason_EXECUTION_BUSY:            "EXECUTION_BUSY",
	errorsv1.ErrorReason_IDEMPOTENCY_KEY_REUSED:    "IDEMPOTENCY_KEY_REUSED",
	errorsv1.ErrorReason_OUTCOME_PENDING:           "OUTCOME_PENDING",
	errorsv1.ErrorReason_ADAPTER_UNAVAILABLE:       "ADAPTER_UNAVAILABLE",
	errorsv1.ErrorReason_SHUTTING_DOWN:             "SHUTTING_DOWN",
	errorsv1.ErrorReason_RATE_LIMITED:              "RATE_LIMITED",
	errorsv1.ErrorReason_TOO_MANY_AUTH_FAILURES:    "TOO_MANY_AUTH_FAILURES",
	errorsv1.ErrorReason_OPERATOR_READ_ONLY:        "OPERATOR_READ_ONLY",
	errorsv1.ErrorReason_SIGNING_SECRET_UNREADABLE: "SIGNING_SECRET_UNREADABLE",
	errorsv1.ErrorReason_INVALID_CALLBACK:          "INVALID_CALLBACK",
	errorsv1.ErrorReason_FOREIGN_EXECUTION:         "FOREIGN_EXECUTION",
	errorsv1.ErrorReason_SYNC_EXECUTION:            "SYNC_EXECUTION",
	errorsv1.ErrorReason_METHOD_NOT_ALLOWED:        "METHOD_NOT_ALLOWED",
	errorsv1.ErrorReason_CALLER_NOT_ALLOWED:        "CALLER_NOT_ALLOWED",
	errorsv1.ErrorReason_PLATFORM_TOKEN_REFUSED:    "PLATFORM_TOKEN_REFUSED",
}

// TestErrorReasonsAreTheWireStrings: each value's String() is the reason as sent, and the enum
// holds no value the table does not.
func TestErrorReasonsAreTheWireStrings(t *testing.T) {
	t.Parallel()
	for r, want := range wire {
		require.Equal(t, want, r.String())
	}
	for n, name := range errorsv1.ErrorReason_name {
		if n == 0 {
			continue
		}
		require.Contains(t, wire, errorsv1.ErrorReason(n), "ErrorReason %s is new: add it to the table with its wire string", name)
	}
}

func TestErrorReason(t *testing.T) {
	t.Parallel()
	refused := func(reason string) error {
		st, err := status.New(codes.FailedPrecondition, "no").WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "integrations"})
		require.NoError(t, err)
		return st.Err()
	}
	require.Equal(t, errorsv1.ErrorReason_ALREADY_SETTLED, rpcstatus.ErrorReason(refused("ALREADY_SETTLED")))
	require.Equal(t, "ALREADY_SETTLED", rpcstatus.Reason(refused("ALREADY_SETTLED")))
	require.Equal(t, errorsv1.ErrorReason_ERROR_REASON_UNSPECIFIED, rpcstatus.ErrorReason(refused("SOMETHING_NEW")), "a reason the enum does not name")
	require.Equal(t, errorsv1.ErrorReason_ERROR_REASON_UNSPECIFIED, rpcstatus.ErrorReason(refused("already_settled")), "reasons compare exactly")
	require.Equal(t, errorsv1.ErrorReason_ERROR_REASON_UNSPECIFIED, rpcstatus.ErrorReason(status.Error(codes.Internal, "no details")))
	require.Equal(t, errorsv1.ErrorReason_ERROR_REASON_UNSPECIFIED, rpcstatus.ErrorReason(errors.New("not a status")))
	require.Equal(t, errorsv1.ErrorReason_ERROR_REASON_UNSPECIFIED, rpcstatus.ErrorReason(nil))
}
