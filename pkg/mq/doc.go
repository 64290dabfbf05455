// Package mq is the message port: the only code in the project that talks to a message broker.
//
// [Broker] is the port, an interface; [Dial] returns the provider [Config] names
// ([ProviderRabbitMQ], [ProviderSTOMP]). The handler-return rules below are
// provider-neutral code (rules.go): a provider supplies the broker primitives — a confirmed copy
// to a retry, delay or dead-letter destination, the settlement of the original on the connection
// it came from, and knowing when that settlement would be stale — and proves it keeps the rules by
// running the contract suite, [github.com/integrations-platform/integrations/pkg/mq/mqtest]. What
// follows describes the rules and then the RabbitMQ provider, [RabbitMQ]: its topology, holding
// queues and reconnects. The STOMP provider, [STOMP], keeps the same rules with the broker's
// scheduler instead of holding queues (see its doc and docs/decisions.md, "The STOMP provider").
//
// A handler returns a [Result] and the port settles the delivery from it; handlers never ack.
//
//   - [Ack]: the work is done; the delivery is acknowledged.
//   - [Fail]: transient. A copy goes to the route's holding queue for the next delay level, with
//     x-delivery-attempt incremented; the holding queue's TTL dead-letters it back to the work
//     queue. Past the route's [RetryPolicy] the copy goes to "<queue>.dlq" instead. The budget is
//     counted on x-delivery-attempt only, never on the broker's x-death. Config.TimeScale shrinks
//     the delays, but never below the policy's Floor: a budget meant to outlast a real outage
//     keeps real seconds in a time-scaled run.
//   - [Reject]: permanent; a copy goes straight to "<queue>.dlq".
//   - [Defer]: the message arrived before its time (see delays below); it is delivered again no
//     earlier than the given delay, without spending an attempt.
//   - the zero Result, a panic, or a handler whose context was cancelled: the delivery is returned
//     to the broker (nack with requeue) and will be delivered again.
//
// Every copy (retry or dead letter) is published mandatory and confirmed by the broker before the
// original is acked; a copy returned, nacked or unconfirmed leaves the original in its queue. So a
// connection that dies in between can duplicate a message but never lose it: consumers must be
// idempotent on [Message.ID].
//
// Topology, per route, under one scope prefix:
//
//	<scope>.<route>                  the work queue (quorum, x-delivery-limit as a backstop)
//	<scope>.<route>.retry.<n>ms      one holding queue per distinct (scaled) retry delay (quorum)
//	<scope>.<route>.delay.<n>ms      one holding queue per distinct (scaled) delay level (quorum)
//	<scope>.<route>.dlq              dead letters (classic: see below)
//
// One holding queue per delay level is what keeps a short delay from waiting behind a long one:
// RabbitMQ only expires messages at the head of a queue. Every holding queue has a per-queue
// x-message-ttl and dead-letters at-least-once back to the work queue.
//
// Scheduled delivery is bounded and kept apart from retries: a route's [Route.DelayLevels] (e.g.
// 1s … 2h) are holding queues of their own. [Broker.PublishAfter] puts a message due in d into the
// largest level not longer than d plus that level's slack — a tenth of it up to a second, or a
// hundredth if more, at least [DelayTolerance] — (or straight into the work queue below the
// smallest), so it never arrives before that level, at most the slack late, and may arrive early
// by the rest of d; a handler takes one early by less than the tolerance as on time. The message carries its
// due time; a handler that sees it early returns [Defer] with what is left, which moves a copy
// (attempt header unchanged) to the next fitting level, or — below the smallest level — holds the
// delivery that long in the worker and calls the handler again. Each deferral waits at least a
// level or the time left, so none can spin. Work due beyond the largest level waits in the
// publisher's own store ([Broker.DelayLevels] says how far that is).
//
// Dead letters carry why: x-dead-reason, x-last-error, x-delivery-attempt, x-first-failure-at,
// x-last-failure-at, x-dead-at, x-source-queue (the broker's x-first-death-* for a message it
// dead-lettered itself). [Broker.DeadLetters] lists a DLQ without losing or reordering it, and
// [Broker.Redrive] moves some or all of it back to the work queue with a fresh attempt budget,
// each copy confirmed before the dead letter is acked; [Broker.Discard] removes named dead letters
// a caller has shown to be explained (their work was done since). DLQs are classic queues because listing
// requeues, and a quorum queue counts every requeue against its delivery limit and serves
// requeued messages in requeue order, which rotates a DLQ listed in part.
//
// Settle only what the broker still holds: amqp091-go's experimental automatic recovery stays off
// (Config.Recovery is nil), because it would re-deliver on a new channel while our workers still
// hold delivery tags of the old one. The port reconnects itself (publishing and consuming on
// separate connections, with backoff and jitter, topology declared again, consumers
// resubscribed) and tracks which channel each delivery came from; a settlement for a replaced
// channel or consumer is counted superseded and left to the broker's redelivery, never tried on
// the new channel (where RabbitMQ would answer 406 and close it). So is one that failed because
// its channel or connection was being torn down (a socket error, an AMQP exception): the broker
// redelivers it too.
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
// [Broker.Diagnose] checks that every queue of a route exists and runs a round trip through the
// route's real work queue: a probe that any process's Consume answers before, and without, its
// handler. [Diagnosis.String] is one line per route.
//
// Every point-to-point name goes through the scope and is validated against [a-zA-Z0-9_\-.:]+.
package mq
