package mq

import (
	"context"
	"time"
)

// driver is a broker under the port. The port (port.go) does what every broker shares: the
// routes and their plans, the names' and arguments' checks, the counters, the publish
// bookkeeping, the diagnosis's frame and Close. A driver does what its broker does its own way,
// in four parts: publishing (application messages and the port's own copies, confirmed),
// consuming, the dead-letter and diagnostic administration, and its connections.
type driver interface {
	// declare makes the queues of the planned routes exist (or leaves what shows they were
	// declared), before the port remembers them.
	declare(ctx context.Context, tops []*topology) error
	// publish writes application messages to queue (to the delay level of a message's delay, when
	// it has one), pipelined, and waits for the broker to confirm each (a publisher confirm, a
	// RECEIPT). sent[i] says whether msgs[i] was written and, nil error, confirmed. err: nothing
	// could be written (no connection).
	publish(ctx context.Context, queue string, msgs []envelope) (sent []sendResult, err error)

	// consume runs one Consume call.
	consume(ctx context.Context, top *topology, r *rules, stop context.CancelFunc, grace time.Duration, concurrency int) error

	// deadLetters lists up to limit dead letters of q, oldest first, without taking them.
	deadLetters(ctx context.Context, q dlqRef, limit int) ([]DeadLetter, error)
	// redrive moves the dead letters of q whose ids are in ids (all when empty) to its work queue
	// with a fresh budget (redriveHeaders), each copy confirmed before its dead letter goes.
	redrive(ctx context.Context, q dlqRef, ids []string) (moved int, err error)
	// discard removes the dead letters of q whose ids are in ids; none when ids is empty.
	discard(ctx context.Context, q dlqRef, ids []string) (removed int, err error)
	// diagnose fills in d what the broker tells of the route's queues and the probe's round
	// trip (see [Diagnosis.answered]), and d's problems.
	diagnose(ctx context.Context, top *topology, timeout time.Duration, d *Diagnosis)
	// deleteRoute deletes (or empties) every queue of a route in this scope.
	deleteRoute(ctx context.Context, top *topology) error
	// close closes the driver's connections, the port's being closed already.
	close(ctx context.Context) error
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
