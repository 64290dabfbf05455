package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// TestAdapterRefusesCallsNotFromThePlatform: the running dummy adapter (on the SDK) refuses an
// Execute or Cancel sent straight to it without the platform's token, with a token signed by
// another key, with the platform's key for another adapter or for another execution — each
// UNAUTHENTICATED, and its journal records no work for any of them — while the platform's own
// calls, sync from the gateway and async from the execution-consumer, run as ever.
func TestAdapterRefusesCallsNotFromThePlatform(t *testing.T) {
	s := newStack(t)
	journal := filepath.Join(t.TempDir(), "journal")
	s.ProgramEnv["dummy-adapter"] = []string{"INTEGRATIONS_DUMMY_JOURNAL=" + journal}
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "dispatcher", "gateway")

	// The platform's calls.
	code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
		[]byte(`{"mode": "MODE_SYNC", "payload": {"greeting": "signed"}}`))
	require.Equal(t, http.StatusOK, code, "%v", body)
	syncID, _ := execution(body)["id"].(string)
	require.Equal(t, "EXECUTION_STATUS_SUCCEEDED", execution(body)["status"], "%v", body)
	code, body = s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
		[]byte(`{"mode": "MODE_ASYNC", "payload": {"greeting": "signed too"}}`))
	require.Equal(t, http.StatusAccepted, code, "%v", body)
	asyncID, _ := execution(body)["id"].(string)
	require.Eventually(t, func() bool {
		var st string
		require.NoError(t, s.schema.Pool.QueryRow(t.Context(), `SELECT status FROM executions WHERE id = $1`, asyncID).Scan(&st))
		return st == "succeeded"
	}, 20*time.Second, 20*time.Millisecond, "the async execution succeeds through the consumer's signed call")

	// The gateway's Cancel of a running attempt carries its token too: the adapter takes it.
	code, body = s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
		[]byte(`{"mode": "MODE_ASYNC", "payload": {"dummy": {"complete_later_ms": 20000}}}`))
	require.Equal(t, http.StatusAccepted, code, "%v", body)
	cancelledID, _ := execution(body)["id"].(string)
	require.Eventually(t, func() bool {
		return strings.Contains(s.Log("dummy-adapter"), cancelledID)
	}, 20*time.Second, 20*time.Millisecond, "the attempt reaches the adapter")
	code, body = s.call(http.MethodPost, "/v1/executions/"+cancelledID+":cancel", s.APIKey, []byte(`{}`))
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Contains(t, s.Log("gateway"), "adapter asked to stop the cancelled attempt")
	require.NotContains(t, s.Log("gateway"), "adapter did not take the cancellation")

	// Calls that do not come from the platform.
	conn, err := grpcx.Dial(s.Addrs["dummy-adapter"])
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	client := adapterv1.NewAdapterServiceClient(conn)
	_, strangerKey, err := platformtoken.Generate()
	require.NoError(t, err)
	forged := &adapterv1.ExecuteRequest{ExecutionId: "forged-1", Attempt: 1, Capability: "dummy.echo"}
	sign := func(key []byte, adapterID, executionID, method string, req *adapterv1.ExecuteRequest) string {
		tok, err := platformtoken.NewSigner(key).Sign(platformtoken.Call{AdapterID: adapterID, ExecutionID: executionID, Attempt: 1,
			Method: method, Deadline: time.Now().Add(10 * time.Second), Request: req})
		require.NoError(t, err)
		return tok
	}
	execute := adapterv1.AdapterService_Execute_FullMethodName
	for name, tok := range map[string]string{
		"no token":                              "",
		"another key":                           sign(strangerKey, "dummy", "forged-1", execute, forged),
		"the platform's key, another adapter":   sign(s.PlatformKey, "another-adapter", "forged-1", execute, forged),
		"the platform's key, another execution": sign(s.PlatformKey, "dummy", "someone-elses", execute, forged),
		// A token captured on its way to the adapter does not run other work.
		"the platform's key, another request": sign(s.PlatformKey, "dummy", "forged-1", execute,
			&adapterv1.ExecuteRequest{ExecutionId: "forged-1", Attempt: 1, Capability: "dummy.other"}),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if tok != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, platformtoken.Header, tok)
		}
		_, err := client.Execute(ctx, forged)
		cancel()
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%s: %v", name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = client.Cancel(ctx, &adapterv1.CancelRequest{ExecutionId: asyncID, Attempt: 1})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "Cancel without a token: %v", err)

	// The journal has the platform's three executions and nothing of the forged calls.
	raw, err := os.ReadFile(journal)
	require.NoError(t, err)
	var recv []string
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.Split(line, "\t")
		require.Len(t, f, 6, "journal line %q", line)
		if f[2] == "recv" {
			recv = append(recv, f[3])
		}
	}
	require.ElementsMatch(t, []string{syncID, asyncID, cancelledID}, recv, "journal:\n%s", raw)
	require.Contains(t, s.Log("dummy-adapter"), "call refused: platform token")
}
