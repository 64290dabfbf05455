package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/integrations-platform/integrations/pkg/execution"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/pkg/metrics"
)

// acceptSeconds is the time InvokeCapability takes, by mode and outcome ("accepted" or
// "refused"). A sync accept includes the provider call it waits for.
var acceptSeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "integrations_accept_seconds",
	Help:    "Time to answer InvokeCapability, by mode (async, sync) and outcome (accepted, refused).",
	Buckets: metrics.LatencyBuckets(),
}, []string{"mode", "outcome"})

// modeLabel is the mode label of a request: its mode, or "unknown" for one that names none.
func modeLabel(m executionv1.Mode) string {
	switch m {
	case executionv1.Mode_MODE_ASYNC:
		return execution.ModeAsync
	case executionv1.Mode_MODE_SYNC:
		return execution.ModeSync
	}
	return "unknown"
}

func outcomeLabel(err error) string {
	if err != nil {
		return "refused"
	}
	return "accepted"
}
