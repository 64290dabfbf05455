package deliver

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/integrations-platform/integrations/pkg/metrics"
)

var (
	// deliverySeconds is one delivery attempt (a webhook POST, or a gRPC consumer's call) to its
	// answer, by result.
	deliverySeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "integrations_delivery_seconds",
		Help:    "Time of one delivery attempt to the application's consumer, by result (delivered, failed).",
		Buckets: metrics.LatencyBuckets(),
	}, []string{"result"})
	// endToEndSeconds is from an execution's accept to its completion event delivered: what the
	// caller waits for an async execution. The accept's time is the database's, now is this
	// host's.
	endToEndSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "integrations_accept_to_delivered_seconds",
		Help:    "Time from an execution's accept to its completion event delivered to the consumer.",
		Buckets: metrics.LatencyBuckets(),
	})
)
