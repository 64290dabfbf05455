package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
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

// waitGateway is a gateway whose execution runs with progress, then succeeds on the third read.
type waitGateway struct {
	fakeGateway
	reads chan struct{}
}

func (w *waitGateway) InvokeCapability(context.Context, *gatewayv1.InvokeCapabilityRequest) (*gatewayv1.InvokeCapabilityResponse, error) {
	return &gatewayv1.InvokeCapabilityResponse{Execution: &executionv1.Execution{Id: "e1", MaxAttempts: 3,
		Status: executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING}}, nil
}

func (w *waitGateway) GetExecution(context.Context, *gatewayv1.GetExecutionRequest) (*gatewayv1.GetExecutionResponse, error) {
	w.reads <- struct{}{}
	e := &executionv1.Execution{Id: "e1", MaxAttempts: 3, Attempt: 1, Status: executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING}
	switch len(w.reads) {
	case 1:
		p, _ := structpb.NewStruct(map[string]any{"percent": 40})
		e.Progress = p
	case 2:
		e.Status = executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED
	}
	return &gatewayv1.GetExecutionResponse{Execution: e}, nil
}

func serveWait(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	gatewayv1.RegisterGatewayServiceServer(srv, &waitGateway{reads: make(chan struct{}, 10)})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func TestInvokeWaitPipedPrintsOnlyTheSettledExecution(t *testing.T) {
	out, err := runRoot(t, "invoke", "dummy.echo", "--wait", "--gateway", serveWait(t), "--api-key", "k")
	require.NoError(t, err)
	var e struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &e), "one JSON document, nothing else: %q", out)
	require.Equal(t, "EXECUTION_STATUS_SUCCEEDED", e.Status)
	require.NotContains(t, out, "\r")
}

func TestInvokeWaitOnATerminalShowsALiveLine(t *testing.T) {
	was := isTerminal
	isTerminal = func(io.Writer) bool { return true }
	t.Cleanup(func() { isTerminal = was })
	out, err := runRoot(t, "invoke", "dummy.echo", "--wait", "--gateway", serveWait(t), "--api-key", "k")
	require.NoError(t, err)
	require.Contains(t, out, "\r\033[Kexecution e1  PENDING  attempt 0/3")
	require.Contains(t, out, "\r\033[Kexecution e1  RUNNING  attempt 1/3  40%")
	require.Contains(t, out, "\r\033[Kexecution e1  SUCCEEDED  attempt 1/3\n{")
}
