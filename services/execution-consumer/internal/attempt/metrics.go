package attempt

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/integrations-platform/integrations/pkg/execution"
	"github.com/integrations-platform/integrations/pkg/metrics"
)

var (
	// queueWaitSeconds is how late an attempt started after its dispatch was due, as the database
	// measured it (store.Started.Overdue): the broker hop and the consumer's backlog.
	queueWaitSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "integrations_queue_wait_seconds",
		Help:    "Time from a dispatch's due time to its attempt starting, as the database measured it.",
		Buckets: metrics.LatencyBuckets(),
	})
	// adapterCallSeconds is the adapter's Execute call, by the shape of its answer.
	adapterCallSeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "integrations_adapter_call_seconds",
		Help:    "Time of one adapter Execute call, by outcome (completed, failed, accepted, not_sent).",
		Buckets: metrics.LatencyBuckets(),
	}, []string{"outcome"})
)

// callOutcome is the outcome label of an adapter call.
func callOutcome(out execution.Outcome) string {
	switch {
	case out.NotSent:
		return "not_sent"
	case out.Kind == execution.OutcomeCompleted:
		return "completed"
	case out.Kind == execution.OutcomeAccepted:
		return "accepted"
	}
	return "failed"
}
