// Package routes names the broker routes the services share. A publisher and its consumers must
// declare a route identically (RabbitMQ refuses a re-declaration with other arguments), so each
// route is defined once, here.
package routes

import (
	"time"

	"github.com/integrations-platform/integrations/pkg/mq"
)

// BlipFloor is the least a time scale shrinks the port-level retry delays of both routes to
// (mq.RetryPolicy.Floor). Those retries exist to outlast the handler's own dependencies failing —
// Postgres restarting or failing over, a pool replacing its dead connections — and such a blip
// lasts seconds of real time in a time-scaled run too. With 5 s, a time-scaled run keeps 1 s, 5 s,
// 5 s (events: 11 s in all) and 1 s, 5 s, 5 s, 5 s (executions: 16 s); unscaled, the routes' own
// delays (36 s and 2m36s) are longer and stand. docs/decisions.md: "Port budgets outlast a blip".
const BlipFloor = 5 * time.Second

// Executions carries ExecutionDispatch messages from the dispatcher to the execution-consumer.
// Its port-level retry covers a consumer that could not do its own work (Postgres or the
// settlement service unreachable), not the provider failing: that is the execution's own
// schedule, kept in Postgres (docs/architecture.md §6, "Two levels of retry").
//
// Its DelayLevels carry dispatches that are due in the future: the dispatcher publishes a dispatch
// due within the largest level (2h) into the largest level not past its due time, and the consumer
// defers one that arrives early (through shorter levels, the last second in the consumer itself);
// dispatches due later wait in Postgres. The levels are not the port-level Retry above: waiting for
// a due time spends no attempt.
var Executions = mq.Route{
	Name: "executions",
	Retry: mq.RetryPolicy{Delays: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute}, MaxAttempts: 5,
		Floor: BlipFloor},
	DelayLevels: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute,
		30 * time.Minute, 2 * time.Hour},
	Prefetch: 32,
}

// Events carries EventNotice messages from the event relay (and a redelivery) to the event
// deliverer. As on Executions, its port-level Retry covers only a deliverer that could not do its
// own work (Postgres unreachable) and is short. The delivery schedule (1m, 5m, 30m, 2h, 6h by
// default) is counted on the event row in Postgres: after a failed attempt the deliverer records
// when the next one is due and returns mq.Defer, so the notice waits in DelayLevels without
// spending a port attempt; it also defers, by the smallest level, a notice whose application is
// at its concurrency bound. The levels reach 6h, the schedule's longest delay; a longer
// configured delay is reached by deferring again.
//
// Retry.Floor (BlipFloor) keeps the budget in real seconds in a time-scaled run. A notice that
// outlives it is not lost: the event relay finds it in the DLQ and publishes a fresh one.
//
// Changing Retry.Delays (or the Floor, in a time-scaled run) changes the names of the route's retry holding queues: a deployment that
// ran with the earlier delays (1m, 5m, 30m, 2h, 6h) keeps those queues, which still dead-letter
// whatever they hold back to the work queue, and can delete them once empty.
var Events = mq.Route{
	Name:  "events",
	Retry: mq.RetryPolicy{Delays: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}, MaxAttempts: 4, Floor: BlipFloor},
	DelayLevels: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute,
		30 * time.Minute, 2 * time.Hour, 6 * time.Hour},
	Prefetch: 32,
}
