// Package mq is the message port: the only code in the project that talks to a message broker.
//
// [Broker] is the port; [Dial] returns it over the driver [Config] names ([ProviderRabbitMQ],
// [ProviderSTOMP]). The port is written once and a broker is a driver under it:
//
//   - port.go is the Broker: the routes declared and planned (names.go), the checks of names and
//     arguments, the publish bookkeeping, the frame of the dead-letter operations and of
//     [Broker.Diagnose], Close, and the [Counters].
//   - engine.go is Consume, the consumer engine: one loop that subscribes and resubscribes with
//     backoff, one worker queue, the diagnostic probe's answer, one drain and shutdown ([Drain]),
//     and the counting of every settlement.
//   - rules.go is the handler-return rules below, which every delivery goes through.
//   - middleware.go is what wraps every handler: its duration (integrations_mq_handler_seconds),
//     panic recovery, the route's [Route.Timeout] and the delivery's trace context.
//   - driver.go is what a broker must do: a driver (declare, publish confirmed, list, redrive and
//     discard dead letters, diagnose, delete, close) and, for Consume, a link (subscribe to
//     deliveries; settle them — acknowledge or return to the broker; give back, lose, recycle,
//     halt and end a subscription; answer a probe) whose deliveries can tell they are stale and
//     publish a confirmed copy of themselves. rabbitmq*.go and stomp*.go are the two drivers.
//
// A third provider is a third driver — a driver, a link, a case in Dial — and nothing more; it
// proves it keeps the contract by running the one suite every provider runs,
// [github.com/integrations-platform/integrations/pkg/mq/mqtest].
//
// A handler returns a [Result] and the port settles the delivery from it; handlers never ack.
//
//   - [Ack]: the work is done; the delivery is acknowledged.
//   - [Fail]: transient. A copy goes to the route's retry for the next delay, with
//     x-delivery-attempt incremented; past the route's [RetryPolicy] the copy goes to
//     "<queue>.dlq" instead. The budget is counted on x-delivery-attempt only, never on a broker's
//     own count. Config.TimeScale shrinks the delays, but never below the policy's Floor: a
//     budget meant to outlast a real outage keeps real seconds in a time-scaled run.
//   - [Reject]: permanent; a copy goes straight to "<queue>.dlq".
//   - [Defer]: the message arrived before its time (see delays below); it is delivered again no
//     earlier than the given delay, without spending an attempt.
//   - the zero Result, a panic, or a handler whose context was cancelled: the delivery is returned
//     to the broker and will be delivered again. A message returned 20 times so is dead-lettered
//     (reason delivery_limit): by the broker's x-delivery-limit on RabbitMQ, by the engine, from
//     the count its copies carry, on STOMP.
//
// Every copy (retry, deferral or dead letter) is confirmed by the broker (a publisher confirm, a
// STOMP RECEIPT) before the original is acknowledged; a copy returned, refused or unconfirmed
// leaves the original to the broker. So a connection that dies in between can duplicate a message
// but never lose it: consumers must be idempotent on [Message.ID].
//
// Scheduled delivery is bounded and kept apart from retries: a route's [Route.DelayLevels] (e.g.
// 1s … 2h) are where delayed messages wait. [Broker.PublishAfter] puts a message due in d into the
// largest level not longer than d plus that level's slack — a tenth of it up to a second, or a
// hundredth if more, at least [DelayTolerance] — (or straight into the work queue below the
// smallest), so it never arrives before that level, at most the slack late, and may arrive early
// by the rest of d; a handler takes one early by less than the tolerance as on time. The message
// carries its due time; a handler that sees it early returns [Defer] with what is left, which
// moves a copy (attempt header unchanged) to the next fitting level, or — below the smallest
// level — holds the delivery that long in the worker and calls the handler again. Each deferral
// waits at least a level or the time left, so none can spin. Work due beyond the largest level
// waits in the publisher's own store ([Broker.DelayLevels] says how far that is).
//
// On RabbitMQ, per route, under one scope prefix:
//
//	<scope>.<route>                  the work queue (quorum, x-delivery-limit as a backstop)
//	<scope>.<route>.retry.<n>ms      one holding queue per distinct (scaled) retry delay (quorum)
//	<scope>.<route>.delay.<n>ms      one holding queue per distinct (scaled) delay level (quorum)
//	<scope>.<route>.dlq              dead letters (classic: see below)
//
// One holding queue per delay is what keeps a short delay from waiting behind a long one:
// RabbitMQ only expires messages at the head of a queue. Every holding queue has a per-queue
// x-message-ttl and dead-letters at-least-once back to the work queue. DLQs are classic queues
// because listing requeues, and a quorum queue counts every requeue against its delivery limit
// and serves requeued messages in requeue order, which rotates a DLQ listed in part.
// amqp091-go's experimental automatic recovery stays off (its recovery would re-deliver on a new
// channel while our workers still hold delivery tags of the old one): the engine resubscribes on
// a new channel itself, each subscription declaring its route again, and the driver reconnects
// (publishing and consuming on separate connections, remembered routes declared again).
//
// On STOMP (ActiveMQ) there are no holding queues: a retry or a deferral is a copy the broker's
// scheduler holds and that carries its due time, which the consumer holds to; a delivery is
// returned to the broker as a confirmed copy (a NACK would dead-letter or drop it), and a route's
// declaration is a marker message, since STOMP cannot ask whether a queue exists (stomp.go, and
// docs/decisions.md, "The STOMP provider").
//
// Settle only what the broker still holds: a settlement of a delivery whose channel or connection
// was replaced, or is being torn down, is counted superseded and left to the broker's redelivery,
// never tried on the new one; one the broker refused on a live connection is counted lost.
//
// Dead letters carry why: x-dead-reason, x-last-error, x-delivery-attempt, x-first-failure-at,
// x-last-failure-at, x-dead-at, x-source-queue (the broker's x-first-death-* for a message it
// dead-lettered itself). [Broker.DeadLetters] lists a DLQ without losing or reordering it, and
// [Broker.Redrive] moves some or all of it back to the work queue with a fresh attempt budget,
// each copy confirmed before the dead letter is acked; [Broker.Discard] removes named dead letters
// a caller has shown to be explained (their work was done since).
//
// A deploy drains consumers with [Drain]: Consume's ctx stops it taking deliveries, the running
// handlers finish under a context of their own, and [Broker.CloseContext] bounds the close.
//
// Trace context travels in the messages' headers (W3C traceparent and tracestate; trace.go):
// a publish writes the trace of its ctx, or of [Outgoing.SpanContext] for a batch of many traces;
// the handler's context carries the delivery's; retry, deferral and dead-letter copies keep it. The
// port starts no span of its own.
//
// [Counters] (published, confirmed, returned, acknowledged, retried, dead-lettered, rejected,
// superseded, lost, requeued, panicked, redriven, deferred) are kept per route and exported as the
// integrations_mq_messages_total metric.
//
// [Broker.Diagnose] checks what the broker tells of each route's queues and runs a round trip
// through the route's real work queue: a probe that any process's Consume answers before, and
// without, its handler. [Diagnosis.String] is one line per route.
//
// Every name goes through the scope and is validated against [a-zA-Z0-9_\-.:]+.
package mq
