package chaos_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/bench/internal/chaos"
	"github.com/integrations-platform/integrations/e2e/stack"
)

// TestShortForm is make chaos's short form, run by make test: a few hundred executions on two
// replicas of every service while every fault type fires, then every invariant. The must-show
// counts (repeats, INTERNAL answers, attempts spent) are printed, not required: make chaos
// -strict requires them.
func TestShortForm(t *testing.T) {
	dbURL := os.Getenv("INTEGRATIONS_TEST_DATABASE_URL")
	if dbURL == "" {
		t.Skip("INTEGRATIONS_TEST_DATABASE_URL not set (make test sets it)")
	}
	bin := os.Getenv("INTEGRATIONS_RABBITMQCTL")
	if bin == "" {
		bin = "rabbitmqctl"
	}
	if _, err := exec.LookPath(bin); err != nil {
		t.Skipf("%s not on PATH: the broker faults and checks need it", bin)
	}
	args := []string{"list_vhosts"}
	if node := os.Getenv("INTEGRATIONS_RABBITMQ_NODE"); node != "" {
		args = append([]string{"-n", node}, args...)
	}
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Skipf("%s cannot reach the broker's node ($INTEGRATIONS_RABBITMQ_NODE=%q): %v: %.300s", bin, os.Getenv("INTEGRATIONS_RABBITMQ_NODE"), err, out)
	}
	amqpURL := os.Getenv("INTEGRATIONS_AMQP_URL")
	if amqpURL == "" {
		amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	root, err := stack.FindRoot()
	require.NoError(t, err)
	var log strings.Builder
	binDir, err := stack.Build(ctx, root, &log)
	require.NoError(t, err, log.String())
	t.Cleanup(func() { _ = os.RemoveAll(binDir) })

	rep, err := chaos.Run(ctx, chaos.Config{
		Root: root, BinDir: binDir, DatabaseURL: dbURL, AMQPURL: amqpURL,
		Mode: chaos.ModeChaos, Replicas: 2, Executions: 300, Rate: 25, Callers: 8,
		SyncShare: 0.15, RESTShare: 0.5,
		FaultEvery: 700 * time.Millisecond, Warmup: 500 * time.Millisecond, FaultsAfter: 5 * time.Second,
		ReceiverFailRate: 0.2, SettleTimeout: 90 * time.Second,
		// An event notice dead-lettered by a burst of dead Postgres connections waits for the
		// stale-notice release, 10 minutes by default and not time-scaled today (issue 10 item
		// 4): here it is released after 3 s, so that the short form checks the recovery within
		// make test's time; make chaos keeps the default and shows the wait.
		Env: []string{"INTEGRATIONS_EVENT_STALE_AFTER=3s"},
		Log: testWriter{t},
	})
	require.NoError(t, err)
	var out strings.Builder
	rep.Print(&out)
	t.Log("\n" + out.String())
	require.Empty(t, rep.Failed, "invariants failed:\n%s", out.String())
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
