package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/integrations-platform/integrations/pkg/metrics"
)

// settleSeconds is the time of the settlement's statement for a Settle or FailAttempt call (the
// transaction that settles or schedules the retry, and writes the event), by operation (settle,
// fail_attempt) and result (ok, or error: a lost settlement, a conflict, a failure).
var settleSeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "integrations_settle_seconds",
	Help:    "Time to record a Settle or FailAttempt, by operation (settle, fail_attempt) and result (ok, error).",
	Buckets: metrics.LatencyBuckets(),
}, []string{"operation", "result"})

func resultLabel(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}
