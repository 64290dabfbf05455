package mq

import (
	"context"
	"time"
)

// What a broker must do under the port, and nothing else: a driver (below), a link for each
// Consume call (link, settler, stream) and its deliveries (delivery). A third provider implements
// these, adds a case to Dial, and runs the contract suite (pkg/mq/mqtest); the port, the consumer
// engine, the rules and the middleware serve it unchanged.

// driver is a broker under the port. The port (port.go) does what every broker shares: the
// routes and their plans, the names' and arguments' checks, the counters, the publish
// bookkeeping, the diagnosis's frame and Close. A driver does what its broker does its own way,
// in four parts: publishing (application messages and the port's own copies, confirmed),
// consuming (a link, under the engine), the dead-letter and diagnostic administration, and its
// connections.
type driver interface {
	// declare makes the queues of the planned routes exist (or leaves what shows they were
	// declared), before the port remembers them.
	declare(ctx context.Context, tops []*topology) error
	// publish writes application messages to queue (to the delay level of a message's delay, when
	// it has one), pipelined, and waits for the broker to confirm each (a publisher confirm, a
	// RECEIPT). sent[i] says whether msgs[i] was written and, nil error, confirmed. err: nothing
	// could be written (no connection).
	publish(ctx context.Context, queue string, msgs []envelope) (sent []sendResult, err error)

	// consume runs one Consume call: the engine over the driver's link, run(ctx, c, link).
	consume(ctx context.Context, c *consumer) error

	// deadLetters lists up to limit dead letters of q, oldest first, without taking them.
	deadLetters(ctx context.Context, q dlqRef, limit int) ([]DeadLetter, error)
	// redrive moves the dead letters of q whose ids are in ids (all when empty) to its work queue
	// with a fresh budget (redriveHeaders), each copy confirmed before its dead letter goes.
	redrive(ctx context.Context, q dlqRef, ids []string) (moved int, err error)
	// discard removes the dead letters of q whose ids are in ids; none when ids is empty.
	discard(ctx context.Context, q dlqRef, ids []string) (removed int, err error)
	// diagnose fills in d what the broker tells of the route's queues and the probe's round
	// trip (Diagnosis.answered), and d's problems.
	diagnose(ctx context.Context, top *topology, timeout time.Duration, d *Diagnosis)
	// deleteRoute deletes (or empties) every queue of a route in this scope.
	deleteRoute(ctx context.Context, top *topology) error
	// close closes the driver's connections, the port's being closed already.
	close(ctx context.Context) error
}

// link is one Consume call's hold on its broker, as a driver makes it. M is the broker client's
// delivery type. The owner goroutine calls its methods but settle, giveBack's reports and
// answerProbe, which run on workers (settler).
type link[M any] interface {
	settler
	// subscribe subscribes to the route's work queue, connecting (and, where the broker needs it,
	// declaring the route) first. It is called again, with backoff, until it succeeds.
	subscribe(ctx context.Context) (stream[M], error)
	// lose retires a stream whose deliveries ended by themselves (its channel or connection is
	// gone, or the broker cancelled it): its deliveries are stale from now on, and the broker
	// redelivers them. reason is why it ended; ours, that the broker ended it for a protocol error
	// of the port's own (a settlement it refused: a bug, counted lost).
	lose(s stream[M]) (ours bool, reason error)
	// recycle ends a live stream, so that the broker returns every delivery it holds unsettled on
	// it: a worker asked for it (settle's recycle) to return one it could neither settle nor give
	// back. Its deliveries are stale once recycle returns.
	recycle(ctx context.Context, s stream[M])
	// halt stops s's flow when the consumer stops taking deliveries, and hands back what the
	// broker had already sent on it (held), to be given back. alive: s's deliveries can still be
	// settled (a halt that failed retires s, and the broker redelivers them).
	halt(s stream[M]) (alive bool, held []M)
	// end closes what the consumer holds (s, if any, and its connection) once the consumer
	// stopped; what is still unsettled goes back to the broker with it. It waits at most grace
	// for the broker's answers.
	end(s stream[M], grace time.Duration)
}

// settler is the part of a link the workers use.
type settler interface {
	// settle applies v to d: acknowledge (actAck), return it to the broker (actRequeue; stopping:
	// the consumer is stopping, and the stream's end may return it), or nothing (actNone, or d
	// stale: superseded). report is called once with the outcome, perhaps later and from another
	// goroutine. recycle asks the owner to recycle d's stream: the broker may still hold d.
	settle(d delivery, v verdict, stopping bool, report func(settled)) (recycle bool)
	// giveBack returns to the broker a delivery the stopping consumer took and did not start (on
	// the owner goroutine); report as settle's.
	giveBack(d delivery, report func(settled))
	// answerProbe answers a diagnostic probe (d.probe()) with counters, unless it is stale; it is
	// settled (acknowledged, not counted) afterwards.
	answerProbe(ctx context.Context, d delivery, counters Counters)
}

// stream is one subscription: the deliveries of one consumer on one channel or connection.
type stream[M any] interface {
	// deliveries is the subscription's deliveries; closed when it ends by itself (lose).
	deliveries() <-chan M
	// delivery is the engine's view of one of its deliveries (on the owner goroutine).
	delivery(m M) delivery
	// generation numbers the subscription's connection or channel, for logs and tests.
	generation() uint64
}

// settled is the outcome of a settlement.
type settled uint8

const (
	settledOK         settled = iota // the broker took it: counted as the verdict says
	settledSuperseded                // the delivery's channel or connection went away: the broker redelivers it
	settledLost                      // refused, or unanswered, on a live channel or connection
)

// delivery is one delivery as the rules and the engine need it from its driver. Its methods run
// on a worker goroutine but done, which any goroutine may call once the engine is done with it.
type delivery interface {
	// message is the handler's view of the delivery; the same one on every call.
	message() *Message
	// stale reports that a settlement of this delivery would be superseded — its connection or
	// consumer is gone, or the broker reissued it — so the broker will deliver it again.
	stale() bool
	// sendCopy publishes the copy o orders and returns once the broker confirmed it, with the
	// destination's name for logs. An error (not confirmed, refused, unroutable, timed out) leaves
	// the original to be returned to the broker: never acked without its copy.
	sendCopy(ctx context.Context, o copyOrder) (dest string, err error)
	// probe reports a diagnostic probe (see [Broker.Diagnose]): answered, never handled.
	probe() bool
	// due is when the delivery may be handled: a broker's scheduler may deliver a delayed copy
	// early, and the engine holds it until then. Zero: at once.
	due() time.Time
	// requeues is how many times the port itself returned this message to the broker, for a
	// broker that does not count them (see deadReasonDeliveryLimit); 0 where the broker counts.
	requeues() int
	// done tells the driver the engine will not touch the delivery again.
	done()
}

// envelope is an application message as the port hands it to a driver: its id and content type
// settled, its headers the application's (applicationHeaders), and the delay level it waits in
// (0: none, straight to the work queue).
type envelope struct {
	id, contentType string
	headers         map[string]any
	body            []byte
	delay           time.Duration
}

// sendResult is what became of one message of a driver's publish.
type sendResult struct {
	written bool  // it went out to the broker (counted published)
	err     error // nil: the broker confirmed it
}

var (
	_ Broker = (*port)(nil)
	_ driver = (*rabbitDriver)(nil)
	_ driver = (*stompDriver)(nil)
)
