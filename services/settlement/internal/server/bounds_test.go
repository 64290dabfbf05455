package server

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	report "github.com/integrations-platform/integrations/sdk/go/outcome"
)

const boundsID = "0190a0c2-0000-7000-8000-000000000001"

func boundsStruct(t *testing.T, raw string) *structpb.Struct {
	t.Helper()
	s := &structpb.Struct{}
	require.NoError(t, protojson.Unmarshal([]byte(raw), s))
	return s
}

// A result settlement cannot store is refused before any statement, as INVALID_ARGUMENT on
// "result" — which is what makes sdk/go/outcome record a protocol failure instead of retrying.
func TestSettleRefusesAnUnstorableResult(t *testing.T) {
	t.Parallel()
	s := &Server{} // no store: a refusal must come before it is used
	for name, result := range map[string]string{
		"NUL":       `{"a":"\u0000"}`,
		"NUL key":   `{"\u0000":1}`,
		"65 levels": strings.Repeat(`{"a":`, 64) + `{}` + strings.Repeat(`}`, 64),
	} {
		_, err := s.Settle(context.Background(), &settlementv1.SettleRequest{
			ExecutionId: boundsID, Attempt: 1,
			FromStatus: executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING,
			Status:     executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, Result: boundsStruct(t, result),
		})
		st := grpcx.ToStatus(err)
		require.Equal(t, codes.InvalidArgument, st.Code(), "%s: %v", name, err)
		require.Equal(t, report.ClassResultRefused, report.Classify(st.Err()), name)
	}
}

func TestFailAttemptRefusesUnstorableTexts(t *testing.T) {
	t.Parallel()
	s := &Server{}
	for name, f := range map[string]*executionv1.Failure{
		"failure.code":    {Class: "permanent", Code: "c\x00"},
		"failure.message": {Class: "permanent", Message: "m\x00"},
		"failure.class":   {Class: "perm\x00anent"},
	} {
		_, err := s.FailAttempt(context.Background(), &settlementv1.FailAttemptRequest{ExecutionId: boundsID, Attempt: 1, Failure: f})
		st := grpcx.ToStatus(err)
		require.Equal(t, codes.InvalidArgument, st.Code(), "%s: %v", name, err)
		require.Contains(t, st.Message(), name)
	}
}
