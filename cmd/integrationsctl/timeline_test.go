package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
)

// fakeGateway answers the read calls the CLI makes with fixed answers.
type fakeGateway struct {
	gatewayv1.UnimplementedGatewayServiceServer
}

var t0 = time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)

func (fakeGateway) GetExecutionTimeline(_ context.Context, req *gatewayv1.GetExecutionTimelineRequest) (*gatewayv1.GetExecutionTimelineResponse, error) {
	return &gatewayv1.GetExecutionTimelineResponse{
		ExecutionId: req.GetId(), Capability: "dummy.echo", ApplicationId: "app",
		Status: executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED,
		Entries: []*gatewayv1.TimelineEntry{
			{At: timestamppb.New(t0), Kind: gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ACCEPTED, Summary: "accepted async dummy.echo"},
			{At: timestamppb.New(t0.Add(time.Second)), Kind: gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ATTEMPT_ENDED, Attempt: 1,
				Summary: "attempt 1 failed:\ntimeout"},
			{At: timestamppb.New(t0.Add(2500 * time.Millisecond)), Kind: gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_SETTLED, Attempt: 2,
				Summary: "settled succeeded"},
		},
	}, nil
}

func (fakeGateway) ListExecutions(context.Context, *gatewayv1.ListExecutionsRequest) (*gatewayv1.ListExecutionsResponse, error) {
	return &gatewayv1.ListExecutionsResponse{Executions: []*executionv1.Execution{{Id: "e1", Capability: "dummy.echo"}}}, nil
}

func serveFake(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	gatewayv1.RegisterGatewayServiceServer(srv, fakeGateway{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func TestTimelinePrintsATableInOrder(t *testing.T) {
	addr := serveFake(t)
	out, err := runRoot(t, "timeline", "0190a0c0-0000-7000-8000-000000000001", "--gateway", addr, "--api-key", "k")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 5, out)
	require.Contains(t, lines[0], "dummy.echo  SUCCEEDED")
	require.Regexp(t, `^TIME\s+SINCE ACCEPT\s+KIND\s+ATTEMPT\s+WHAT$`, lines[1])
	require.Regexp(t, `^2026-01-01T10:00:00.000Z\s+\+0s\s+accepted\s+-\s+accepted async dummy.echo$`, lines[2])
	require.Regexp(t, `\+1s\s+attempt_ended\s+1\s+attempt 1 failed: timeout$`, lines[3], "one line per entry")
	require.Regexp(t, `\+2.5s\s+settled\s+2\s+settled succeeded$`, lines[4])
}

func TestReadCommandsPrintJSON(t *testing.T) {
	addr := serveFake(t)
	out, err := runRoot(t, "timeline", "x", "--gateway", addr, "--api-key", "k", "--output", "json")
	require.NoError(t, err)
	var tl struct {
		ExecutionID string `json:"execution_id"`
		Entries     []struct {
			Kind    string `json:"kind"`
			Attempt int    `json:"attempt"`
		} `json:"entries"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &tl), out)
	require.Equal(t, "x", tl.ExecutionID)
	require.Len(t, tl.Entries, 3)
	require.Equal(t, "TIMELINE_ENTRY_KIND_SETTLED", tl.Entries[2].Kind)

	out, err = runRoot(t, "list", "--gateway", addr, "--api-key", "k", "-o", "json")
	require.NoError(t, err)
	var list struct {
		Executions []struct {
			ID string `json:"id"`
		} `json:"executions"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Equal(t, "e1", list.Executions[0].ID)

	_, err = runRoot(t, "list", "--gateway", addr, "--api-key", "k", "-o", "yaml")
	require.ErrorContains(t, err, `--output: "yaml" is not text or json`)
}
