package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LatencyBuckets are the buckets of every latency histogram (integrations_*_seconds and the
// per-RPC handling times): 24 exponential buckets from 1 ms to 10 minutes, so one set covers a
// webhook POST of a few milliseconds and a queue wait or an accept → delivered of minutes (a
// retried attempt waits out its backoff), with about 1.8× between bounds — p99 is read to
// within a bucket at every scale.
func LatencyBuckets() []float64 {
	return prometheus.ExponentialBucketsRange(0.001, 600, 24)
}

// Since is the seconds from t to now for a histogram, and 0 for a zero t or one in the future
// (another host's clock a little ahead), so a clock skew never observes a negative duration.
func Since(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	d := time.Since(t).Seconds()
	if d < 0 {
		return 0
	}
	return d
}
