// Package mqbench measures the message port (pkg/mq) on a real broker beside that broker's raw
// baseline doing the same work. On RabbitMQ the baseline is amqp091-go: persistent, mandatory
// publishes with pipelined confirms into a quorum queue declared like the port's work queue,
// consumed with per-consumer prefetch and one basic.ack per delivery. On a STOMP broker
// (ActiveMQ) it is raw frames over pkg/stomp: persistent SENDs with pipelined receipts, one
// client-individual SUBSCRIBE with the same prefetch, one ACK per delivery.
//
// Every measurement is end to end: from the first publish until the N-th delivery is settled.
package mqbench

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/integrations-platform/integrations/bench/internal/load"
)

// tsHeader carries the publish time (UnixNano) for the latency figures.
const tsHeader = "bench-ts"

// Raw is a provider's raw baseline: its broker's own client doing what the port does, with
// nothing of the port's bookkeeping, measured in the same run on the same broker. *Baseline is
// RabbitMQ's (amqp091-go), *STOMPBaseline a STOMP broker's (frames over pkg/stomp).
type Raw interface {
	// ServerVersion names the broker, for the report's header.
	ServerVersion() string
	// Declare declares a queue and, for the failed path, its holding destination.
	Declare(queue string, holdTTL time.Duration) error
	// Consumers reports the consumer count of a queue: the clock starts once a consumer is
	// subscribed, for the port's runs too.
	Consumers(queue string) (int, error)
	// Run is the ack path, RunFail the failed path (copy, confirm, ack; the copy comes back).
	Run(ctx context.Context, queue string, p Params) (Run, error)
	RunFail(ctx context.Context, queue string, p Params) (Run, error)
	// Cleanup deletes what Declare declared; Close closes the connections.
	Cleanup() error
	Close()
}

var _ Raw = (*Baseline)(nil)

// Params is one measured run.
type Params struct {
	N           int           // messages
	Concurrency int           // consumer goroutines (baseline) or Consume concurrency (port)
	Prefetch    int           // per-consumer prefetch
	Window      int           // publishes awaiting confirms at most (baseline: sliding window)
	Publishers  int           // port: goroutines calling PublishAll with batches of Window/Publishers
	BodySize    int           // payload bytes
	Timeout     time.Duration // gives up on a run after this long
}

// Run is the outcome of one measured run.
type Run struct {
	Elapsed time.Duration // first publish → last settlement
	Publish time.Duration // first publish → last confirm
	P50     time.Duration // publish → handler, zero when not measured
	P99     time.Duration
	Note    string // anything off in the accounting (counters that do not add up)
}

// Rate is messages per second over Elapsed.
func (r Run) Rate(n int) float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(n) / r.Elapsed.Seconds()
}

// Summary is the median of repeated runs.
type Summary struct {
	Runs   []Run
	Median Run     // the run with the median elapsed time
	Min    float64 // lowest msg/s among the runs
	Max    float64 // highest msg/s among the runs
}

// Summarize takes the median run by elapsed time (the lower middle one for an even count).
func Summarize(n int, runs []Run) Summary {
	if len(runs) == 0 {
		return Summary{}
	}
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b Run) int { return int(a.Elapsed - b.Elapsed) })
	s := Summary{Runs: runs, Median: sorted[(len(sorted)-1)/2]}
	s.Min, s.Max = sorted[len(sorted)-1].Rate(n), sorted[0].Rate(n)
	// Latency percentiles are medians of their own, not the median run's.
	s.Median.P50 = load.MedianOf(runs, func(r Run) time.Duration { return r.P50 })
	s.Median.P99 = load.MedianOf(runs, func(r Run) time.Duration { return r.P99 })
	for _, r := range runs {
		if r.Note != "" {
			s.Median.Note = r.Note
		}
	}
	return s
}

// latencies records publish→handler latencies into a preallocated slice.
type latencies struct {
	next atomic.Int64
	d    []time.Duration
}

func newLatencies(n int) *latencies { return &latencies{d: make([]time.Duration, n)} }

func (l *latencies) record(publishedNanos int64) {
	if l == nil {
		return
	}
	i := l.next.Add(1) - 1
	if int(i) < len(l.d) {
		l.d[i] = time.Duration(time.Now().UnixNano() - publishedNanos)
	}
}

// percentiles returns p50 and p99 of what was recorded.
func (l *latencies) percentiles() (p50, p99 time.Duration) {
	if l == nil {
		return 0, 0
	}
	n := min(int(l.next.Load()), len(l.d))
	if n == 0 {
		return 0, 0
	}
	d := l.d[:n]
	slices.Sort(d)
	return d[(n-1)*50/100], d[(n-1)*99/100]
}

// tsOf reads the publish timestamp header: an int64 where the broker's headers are typed
// (AMQP), its decimal text where they are text (STOMP).
func tsOf(h map[string]any) (int64, bool) {
	switch v := h[tsHeader].(type) {
	case int64:
		return v, true
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// Body returns a random payload of n bytes, shared by every message of a run.
func Body(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return b
}
