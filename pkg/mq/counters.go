package mq

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Counters is a snapshot of one route's durability counters since Dial. Read them as an account:
// every application publish is Confirmed or Returned or failed; every delivery ends Acknowledged,
// Retried, DeadLettered, Deferred, Requeued, Superseded or Lost. Diagnostic probes are not counted.
type Counters struct {
	Published    uint64 // application messages written to the broker (Publish, PublishAll)
	Confirmed    uint64 // of those, confirmed by the broker and not returned
	Returned     uint64 // of those, returned as unroutable (mandatory): the publish failed
	Acknowledged uint64 // deliveries acked after the handler returned Ack
	Retried      uint64 // deliveries acked after a confirmed copy went to a holding queue
	DeadLettered uint64 // deliveries acked after a confirmed copy went to the DLQ (exhausted or rejected)
	Rejected     uint64 // of DeadLettered, those whose handler returned Reject
	Superseded   uint64 // settlements withheld, or failed, because the delivery's channel was closed, replaced or being torn down; the broker redelivers
	Lost         uint64 // settlements that failed on a live channel: outcome unknown
	Requeued     uint64 // deliveries nacked back to the broker (zero Result, panic, shutdown, copy not confirmed)
	Panicked     uint64 // handler panics (each also counted Requeued, or Superseded)
	Redriven     uint64 // dead letters moved back to the work queue by Redrive (confirmed, then acked in the DLQ)
	Deferred     uint64 // deliveries acked after Defer sent a confirmed copy to a delay holding queue
}

type event int

const (
	evPublished event = iota
	evConfirmed
	evReturned
	evAcknowledged
	evRetried
	evDeadLettered
	evRejected
	evSuperseded
	evLost
	evRequeued
	evPanicked
	evRedriven
	evDeferred
	numEvents
)

// eventNames are the metric's event label values, indexed by event.
var eventNames = [numEvents]string{
	"published", "confirmed", "returned", "acknowledged", "retried", "dead_lettered", "rejected",
	"superseded", "lost", "requeued", "panicked", "redriven", "deferred",
}

// newMetric is the integrations_mq_messages_total counter vec, registered with reg when given.
func newMetric(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	return registerShared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "integrations_mq_messages_total",
		Help: "Messages through the message port, by route and durability event.",
	}, []string{"route", "event"}))
}

// registerShared registers c with reg, when given. A second Broker in the same process (tests, a
// diagnostic) shares the collector already registered under the same name instead of failing.
func registerShared[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var none C
		return none, fmt.Errorf("register mq metrics: %w", err)
	}
	return c, nil
}

// routeStats counts one route's events, atomically and in the metric.
type routeStats struct {
	n [numEvents]atomic.Uint64
	m [numEvents]prometheus.Counter
}

func newRouteStats(vec *prometheus.CounterVec, route string) *routeStats {
	s := &routeStats{}
	for e := range numEvents {
		s.m[e] = vec.WithLabelValues(route, eventNames[e])
	}
	return s
}

func (s *routeStats) add(e event, n int) {
	if n <= 0 {
		return
	}
	s.n[e].Add(uint64(n))
	s.m[e].Add(float64(n))
}

func (s *routeStats) inc(e event) { s.add(e, 1) }

func (s *routeStats) snapshot() Counters {
	return Counters{
		Published:    s.n[evPublished].Load(),
		Confirmed:    s.n[evConfirmed].Load(),
		Returned:     s.n[evReturned].Load(),
		Acknowledged: s.n[evAcknowledged].Load(),
		Retried:      s.n[evRetried].Load(),
		DeadLettered: s.n[evDeadLettered].Load(),
		Rejected:     s.n[evRejected].Load(),
		Superseded:   s.n[evSuperseded].Load(),
		Lost:         s.n[evLost].Load(),
		Requeued:     s.n[evRequeued].Load(),
		Panicked:     s.n[evPanicked].Load(),
		Redriven:     s.n[evRedriven].Load(),
		Deferred:     s.n[evDeferred].Load(),
	}
}
