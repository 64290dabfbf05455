package mq

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/integrations-platform/integrations/pkg/safetext"
)

type outcome uint8

const (
	outcomeNone outcome = iota // the zero Result: never an acknowledgement
	outcomeAck
	outcomeFail
	outcomeReject
	outcomeDefer
	outcomePanicked // the recoverer's: the handler panicked; returned to the broker as outcomeNone
)

// Result is what a handler returns; it decides how the delivery is settled. The zero Result is
// never an acknowledgement: the delivery goes back to the broker (nack with requeue).
type Result struct {
	outcome outcome
	err     error
	delay   time.Duration // Defer's
}

// Ack is the Result of a handler whose work is done: the delivery is acknowledged.
func Ack() Result { return Result{outcome: outcomeAck} }

// Fail is the Result of a transient failure: the message is retried by republishing it to the
// route's holding queue for the next delay, and dead-lettered once the route's RetryPolicy is
// exhausted. err is recorded in the x-last-error header.
func Fail(err error) Result { return Result{outcome: outcomeFail, err: err} }

// Reject is the Result of a permanent failure: the message goes straight to the route's DLQ with
// x-dead-reason "rejected" and err in x-last-error.
func Reject(err error) Result { return Result{outcome: outcomeReject, err: err} }

// Defer is the Result of a message that arrived before its time: deliver it again no earlier than
// d from now, without spending an attempt (x-delivery-attempt is kept, not incremented) and
// without an error.
//
// When d is at least the route's smallest [Route.DelayLevels] level, a copy goes to the holding
// queue of the largest level not longer than d — confirmed before the original is acked — and
// comes back through the work queue; a message deferred that way may still be early, by up to d
// minus that level, and the handler defers it again. When d is shorter than the smallest level
// the delivery is held in the worker for d (at least 1 ms) and the handler is called again with
// the same Message; shutdown meanwhile returns it to the broker. Either way every deferral waits,
// so a handler cannot spin on Defer. On a route without DelayLevels Defer
// is a programming error: it is logged and the delivery is requeued.
func Defer(d time.Duration) Result { return Result{outcome: outcomeDefer, delay: d} }

// Err is the error given to Fail or Reject, nil otherwise. It lets middleware log or wrap results.
func (r Result) Err() error { return r.err }

// String names the outcome, for logs and test failures.
func (r Result) String() string {
	if r.outcome == outcomeDefer {
		return "defer " + r.delay.String()
	}
	return r.kind()
}

// kind names the outcome alone, for metrics' labels.
func (r Result) kind() string {
	switch r.outcome {
	case outcomeAck:
		return "ack"
	case outcomeFail:
		return "fail"
	case outcomeReject:
		return "reject"
	case outcomeDefer:
		return "defer"
	case outcomePanicked:
		return "panic"
	default:
		return "none"
	}
}

// Handler handles one delivery. ctx is cancelled on shutdown; a cancelled handler's delivery is
// returned to the broker, never acked (unless the handler already returned Ack()). A Handler runs
// concurrently with other Handlers of the same Consume call, and may see the same message again
// (after a retry, a lost connection or a shutdown): it must be idempotent on Message.ID.
type Handler func(ctx context.Context, m *Message) Result

// Message is one delivery as a handler sees it. The handler owns it: Body and Headers are copies.
type Message struct {
	ID          string         // AMQP message-id: the message's stable identity, kept across retries
	Route       string         // the route name (unscoped)
	Body        []byte         // the payload; never logged by this package
	Headers     map[string]any // application headers, plus the port's x- bookkeeping headers
	Attempt     int            // from the x-delivery-attempt header; 1 on first delivery
	Redelivered bool           // the broker delivered this message before (without settlement)
}

// Outgoing is a message to publish.
type Outgoing struct {
	ID          string // message-id; generated (uuid) when empty
	Body        []byte
	ContentType string // default "application/x-protobuf"
	// Headers are application headers. The port's own bookkeeping headers (x-delivery-attempt and
	// the x-dead-*/x-*-failure-*/x-last-error family) are dropped, so republishing a consumed or
	// dead-lettered message starts it afresh at attempt 1.
	Headers map[string]any
	// SpanContext is the trace this message continues, when it is not the publish's ctx's: a
	// batch publishes messages of many traces in one call. Zero: ctx's (see trace.go).
	SpanContext trace.SpanContext
}

// RetryPolicy is the port-level budget for a handler that returns Fail.
type RetryPolicy struct {
	// Delays is the delay before attempt 2, 3, ...; one holding queue per distinct delay. The last
	// delay repeats if MaxAttempts exceeds len(Delays)+1. Every delay must be positive.
	Delays []time.Duration
	// MaxAttempts is the total number of deliveries including the first; past it the message is
	// dead-lettered. 0 means len(Delays)+1. 1 means no retry.
	MaxAttempts int
	// Floor is the least Config.TimeScale shrinks a delay to: a delay d waits at least
	// min(d, Floor) whatever the scale. A budget that exists to outlast real outages (a Postgres
	// pool reconnecting, a failover) must not shrink with the platform's own schedules: a blip
	// lasts its seconds in a time-scaled run too. 0: delays scale all the way (to 1 ms at least).
	Floor time.Duration
}

// Route is a point-to-point queue and the policy for its deliveries.
type Route struct {
	Name  string      // unscoped name, e.g. "executions"; validated
	Retry RetryPolicy // what Fail does
	// DelayLevels are the scheduling delays [Broker.PublishAfter] and [Defer] can wait in, one
	// holding queue "<queue>.delay.<n>ms" per distinct (scaled) level, in any order; every level
	// must be positive. They are not the retry policy: a delayed message is not a failed one.
	// A message waits in the largest level not longer than its delay, so the levels bound how
	// early it can arrive (the handler defers it again) and the largest bounds how far ahead a
	// publisher can schedule through the broker.
	DelayLevels []time.Duration
	Prefetch    int // per-consumer prefetch; default 32
	// Timeout bounds one handler call: its context ends Timeout after the call began, and the
	// handler's Result is settled as usual (a Fail with the context's error is retried). 0: no
	// bound but the consumer's own shutdown.
	Timeout time.Duration
}

// DeadReasonExhausted is a dead letter's Reason when a handler returned Fail past the route's
// RetryPolicy: the handler could not do its work in time, which says nothing against the message.
const DeadReasonExhausted = "retry_exhausted"

// Headers the port reads and writes. Attempts are counted on x-delivery-attempt only, never on the
// broker's x-death, whose counting of republished messages changed across broker versions.
const (
	hdrAttempt      = "x-delivery-attempt"
	hdrLastError    = "x-last-error"
	hdrFirstFailure = "x-first-failure-at"
	hdrLastFailure  = "x-last-failure-at"
	hdrDeadReason   = "x-dead-reason"
	hdrSourceQueue  = "x-source-queue"
	hdrDeadAt       = "x-dead-at"
	// hdrRedriven counts the Redrives a message went through. It survives retries, deferrals and
	// dead-lettering (unlike the budget's headers, which a Redrive resets), so that an automatic
	// recovery can stop redriving a message that keeps failing.
	hdrRedriven = "x-redriven"
	// hdrPublishTag correlates a basic.return with the publish it answers: message ids repeat
	// (retries, duplicates in one batch) so they cannot. Internal; never shown to handlers.
	hdrPublishTag = "x-mq-publish-tag"

	// hdrProbe marks a diagnostic probe; its value is the probe's id, echoed as the reply's
	// correlation id. Dropped from application publishes, so no application message is a probe.
	hdrProbe = "x-mq-probe"

	deadReasonExhausted = DeadReasonExhausted
	deadReasonRejected  = "rejected" // Reject

	// maxErrorLen bounds x-last-error: headers travel with every copy and count against the
	// broker's frame size.
	maxErrorLen        = 512
	defaultContentType = "application/x-protobuf"
)

// bookkeeping headers are owned by the port: dropped from application publishes.
var bookkeeping = map[string]bool{
	hdrAttempt: true, hdrLastError: true, hdrFirstFailure: true, hdrLastFailure: true,
	hdrDeadReason: true, hdrSourceQueue: true, hdrDeadAt: true, hdrPublishTag: true, hdrProbe: true,
	hdrRedriven: true,
}

// brokerHeader reports headers the broker adds on dead-lettering and delivery. They are dropped
// from our copies: each dead-lettering would otherwise grow x-death further, and the copy is a new
// message to the broker.
func brokerHeader(k string) bool {
	switch k {
	case "x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
		"x-last-death-exchange", "x-last-death-queue", "x-last-death-reason", "x-delivery-count":
		return true
	}
	return false
}

// attemptOf reads x-delivery-attempt, whatever integer type it arrived as; 1 when absent or
// nonsensical (a message published by someone else starts at attempt 1).
func attemptOf(h map[string]any) int {
	n, ok := intHeader(h, hdrAttempt)
	if !ok || n < 1 || n > 1<<30 {
		return 1
	}
	return int(n)
}

// redrivenOf reads x-redriven: 0 when absent or malformed.
func redrivenOf(h map[string]any) int {
	n, ok := intHeader(h, hdrRedriven)
	if !ok || n < 0 || n > 1<<30 {
		return 0
	}
	return int(n)
}

// intHeader reads an integer header in any of the widths AMQP tables carry.
func intHeader(h map[string]any, key string) (int64, bool) {
	var n int64
	switch v := h[key].(type) {
	case int8:
		n = int64(v)
	case int16:
		n = int64(v)
	case int32:
		n = int64(v)
	case int64:
		n = v
	case int:
		n = int64(v)
	case uint8:
		n = int64(v)
	case uint16:
		n = int64(v)
	case uint32:
		n = int64(v)
	default:
		return 0, false
	}
	return n, true
}

// errText renders a handler's error for x-last-error: valid UTF-8, no URL an HTTP client error
// carried, at most maxErrorLen bytes.
func errText(err error) string {
	if err == nil {
		return "no error given"
	}
	return safetext.Error(err, maxErrorLen)
}

// newMessage builds the handler's view of an AMQP delivery.
func newMessage(route string, d *amqp.Delivery) *Message {
	return messageOf(route, d.MessageId, d.Body, d.Headers, d.Redelivered)
}

// messageOf builds the handler's view of a delivery, for every provider: copies of the body and
// headers (without the port's internal publish tag), the attempt from x-delivery-attempt.
// headers must hold decoded values (see copyOrder.apply).
func messageOf(route, id string, body []byte, headers map[string]any, redelivered bool) *Message {
	h := make(map[string]any, len(headers))
	for k, v := range headers {
		if k != hdrPublishTag {
			h[k] = v
		}
	}
	return &Message{
		ID:          id,
		Route:       route,
		Body:        append([]byte(nil), body...),
		Headers:     h,
		Attempt:     attemptOf(headers),
		Redelivered: redelivered,
	}
}

// applicationHeaders are an Outgoing's headers as every provider publishes them: without the
// port's bookkeeping (a republished message starts afresh) and the broker's own, and with the
// trace context of m.SpanContext or else of ctx (see trace.go).
func applicationHeaders(ctx context.Context, m Outgoing) map[string]any {
	h := make(map[string]any, len(m.Headers)+1)
	for k, v := range m.Headers {
		if !bookkeeping[k] && !brokerHeader(k) {
			h[k] = v
		}
	}
	injectTrace(ctx, m.SpanContext, h)
	return h
}

// redriveHeaders turns a dead letter's headers (a copy's, which the caller owns) into a redriven
// message's: the port's bookkeeping removed, so it starts again at attempt 1 with a full budget,
// and x-redriven counting one more redrive.
func redriveHeaders(h map[string]any) {
	n := min(redrivenOf(h)+1, 1<<30)
	for k := range bookkeeping {
		delete(h, k)
	}
	h[hdrRedriven] = int32(n)
}

// copyOf is the Publishing for a retry or dead-letter copy of d: same identity and properties, the
// application and bookkeeping headers, without the broker's own headers. Expiration and UserId are
// left out: a per-message TTL would defeat the holding queues, and a foreign user-id would be
// refused by the broker.
func copyOf(d *amqp.Delivery) amqp.Publishing {
	h := make(amqp.Table, len(d.Headers)+6)
	for k, v := range d.Headers {
		if !brokerHeader(k) && k != hdrPublishTag {
			h[k] = v
		}
	}
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
