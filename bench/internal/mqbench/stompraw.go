package mqbench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// STOMPBaseline is raw STOMP 1.2 frames over pkg/stomp doing what the port's STOMP provider does
// on its paths, with nothing of the port's bookkeeping: a publishing connection that SENDs with a
// receipt each, up to a window of them awaiting their RECEIPT, and a consuming connection with one
// SUBSCRIBE (ack:client-individual, the same prefetch) whose deliveries are ACKed one by one.
// The failed path is the port's retry done by hand: a copy SENT back to the queue with
// x-delivery-attempt 2 and the broker's scheduled delay (ActiveMQ's AMQ_SCHEDULED_DELAY), its
// RECEIPT awaited, then the original ACKed.
//
// ACKs carry no receipt, as amqp091-go's basic.ack has no answer: an ACK lost with its connection
// leaves the delivery to be redelivered, which is the at-least-once the port keeps too.
type STOMPBaseline struct {
	// AckReceipt has each ACK wait for its RECEIPT, as a provider that must tell a settled delivery
	// from a lost one does: the baseline of that choice rather than of the fastest ACK.
	AckReceipt bool

	url      string
	pub, con *stomp.Conn

	mu        sync.Mutex
	adv       *stomp.Conn              // the consumer advisories' own connection, dialed on first use
	holds     map[string]time.Duration // queue → the failed path's scheduled delay
	queues    []string                 // declared, emptied by Cleanup when a run left messages
	dirty     map[string]bool          // queues a run may have left messages in
	consumers map[string]*advisory     // queue → its consumer advisories
}

// advisory follows one queue's consumer count from ActiveMQ's consumer advisory topic: STOMP has
// no query for it, but every advisory message carries the queue's count as a header, and a new
// subscriber is told of the consumers that already exist.
type advisory struct {
	sub   *stomp.Subscription
	count atomic.Int64
}

var _ Raw = (*STOMPBaseline)(nil)

// DialSTOMPBaseline opens the baseline's two connections to the broker at url (stomp://...).
func DialSTOMPBaseline(ctx context.Context, url string) (*STOMPBaseline, error) {
	b := &STOMPBaseline{url: url, holds: map[string]time.Duration{}, dirty: map[string]bool{}, consumers: map[string]*advisory{}}
	var err error
	if b.pub, err = stomp.Dial(ctx, url); err != nil {
		return nil, fmt.Errorf("stomp baseline: dial: %w", err)
	}
	if b.con, err = stomp.Dial(ctx, url); err != nil {
		b.pub.Close(ctx) //nolint:errcheck // already failing
		return nil, fmt.Errorf("stomp baseline: dial: %w", err)
	}
	return b, nil
}

// ServerVersion is the broker's server header (e.g. ActiveMQ/5.17.2).
func (b *STOMPBaseline) ServerVersion() string { return b.pub.Server() }

// Close closes both connections.
func (b *STOMPBaseline) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.pub.Close(ctx) //nolint:errcheck // done with it
	b.con.Close(ctx) //nolint:errcheck // done with it
	b.mu.Lock()
	adv := b.adv
	b.mu.Unlock()
	if adv != nil {
		adv.Close(ctx) //nolint:errcheck // done with it
	}
}

// destination is the STOMP destination of a queue name, whether or not it is given with its
// /queue/ prefix (the port's QueueName may give either).
func destination(queue string) string {
	if strings.HasPrefix(queue, "/queue/") {
		return queue
	}
	return "/queue/" + queue
}

// Declare remembers the queue and the failed path's delay: ActiveMQ creates a queue on its first
// SEND or SUBSCRIBE, and a scheduled delivery needs no holding queue.
func (b *STOMPBaseline) Declare(queue string, holdTTL time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queues = append(b.queues, queue)
	b.holds[queue] = holdTTL
	return nil
}

// advisoryHint is what to do when ActiveMQ ends the connection an advisory should have come on:
// without its JSON translator's jars it cannot send one over STOMP.
const advisoryHint = "an ActiveMQ without xstream and jettison on its class path cannot send advisories over STOMP; " +
	"restart one started by an older scripts/deps.sh: scripts/deps.sh down stomp && scripts/deps.sh up stomp"

// Consumers is the queue's consumer count as the broker's last consumer advisory gave it. The
// first call for a queue subscribes to its advisories and answers 0; the broker then reports the
// consumers already there, so a caller polling it sees the count within a round trip.
func (b *STOMPBaseline) Consumers(queue string) (int, error) {
	name := strings.TrimPrefix(destination(queue), "/queue/")
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.adv != nil {
		select {
		case <-b.adv.Done():
			return 0, fmt.Errorf("stomp baseline: the consumer advisories' connection ended (%s): %w", advisoryHint, b.adv.Err())
		default:
		}
	}
	if a, ok := b.consumers[name]; ok {
		return int(a.count.Load()), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if b.adv == nil {
		// A connection of its own: a broker that cannot send advisories ends it, not the runs'.
		c, err := stomp.Dial(ctx, b.url)
		if err != nil {
			return 0, fmt.Errorf("stomp baseline: dial for the consumer advisories: %w", err)
		}
		b.adv = c
	}
	// The advisory is an ActiveMQ command, which ActiveMQ turns into a STOMP frame only through
	// its JSON translator (xstream and jettison on its class path: scripts/deps.sh links them).
	sub, err := b.adv.Subscribe(ctx, "/topic/ActiveMQ.Advisory.Consumer.Queue."+name, stomp.SubscribeOptions{
		Ack:     stomp.AckAuto,
		Headers: []stomp.Header{{Key: "transformation", Value: "jms-advisory-json"}},
	})
	if err != nil {
		return 0, fmt.Errorf("stomp baseline: subscribe to the consumer advisories of %q (%s): %w", name, advisoryHint, err)
	}
	a := &advisory{sub: sub}
	b.consumers[name] = a
	go func() {
		for m := range sub.C() {
			if v, ok := m.Header("consumerCount"); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					a.count.Store(n)
				}
			}
		}
	}()
	return 0, nil
}

// Cleanup empties the queues a run may have left messages in. ActiveMQ Classic has no way to
// delete a destination over STOMP; an empty one costs the broker a little memory until it
// restarts.
func (b *STOMPBaseline) Cleanup() error {
	b.mu.Lock()
	var dirty []string
	for _, q := range b.queues {
		if b.dirty[q] {
			dirty = append(dirty, q)
		}
	}
	advisories := b.consumers
	b.consumers = map[string]*advisory{}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, a := range advisories {
		a.sub.Unsubscribe(ctx) //nolint:errcheck // the connection closes next
	}
	var errs []error
	for _, q := range dirty {
		if err := b.drain(ctx, q); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// drain consumes a queue with auto acknowledgement until nothing has arrived for a moment.
func (b *STOMPBaseline) drain(ctx context.Context, queue string) error {
	sub, err := b.con.Subscribe(ctx, destination(queue), stomp.SubscribeOptions{Ack: stomp.AckAuto})
	if err != nil {
		return fmt.Errorf("stomp baseline: drain %q: %w", queue, err)
	}
	defer sub.Unsubscribe(ctx) //nolint:errcheck // best effort
	// A queue has no depth to ask for over STOMP: silence is the only sign it is empty.
	idle := time.NewTimer(500 * time.Millisecond)
	defer idle.Stop()
	for {
		select {
		case _, ok := <-sub.C():
			if !ok {
				return fmt.Errorf("stomp baseline: drain %q: %w", queue, b.con.Err())
			}
			idle.Reset(500 * time.Millisecond)
		case <-idle.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("stomp baseline: drain %q: %w", queue, ctx.Err())
		}
	}
}

// Run SENDs p.N persistent messages, up to p.Window awaiting their RECEIPT at once, while
// p.Concurrency goroutines take the deliveries of one SUBSCRIBE (client-individual, prefetch
// p.Prefetch) and ACK each one.
func (b *STOMPBaseline) Run(ctx context.Context, queue string, p Params) (Run, error) {
	return b.run(ctx, queue, p, func(context.Context, *stomp.Message) (bool, error) { return true, nil })
}

// attemptHeader is the port's attempt counter, as the STOMP provider writes it.
const attemptHeader = "x-delivery-attempt"

// RunFail is Run with the port's failed path done by hand: a first delivery is SENT again as a
// copy with x-delivery-attempt 2, scheduled the queue's Declare delay later (AMQ_SCHEDULED_DELAY),
// its RECEIPT awaited, then the original ACKed; the copy's delivery is ACKed.
func (b *STOMPBaseline) RunFail(ctx context.Context, queue string, p Params) (Run, error) {
	b.mu.Lock()
	delay := b.holds[queue]
	b.mu.Unlock()
	dest := destination(queue)
	return b.run(ctx, queue, p, func(ctx context.Context, m *stomp.Message) (bool, error) {
		if a, _ := m.Header(attemptHeader); a != "" && a != "1" {
			return true, nil
		}
		h := make([]stomp.Header, 0, 6)
		for _, k := range []string{tsHeader, "correlation-id", "content-type"} {
			if v, ok := m.Header(k); ok {
				h = append(h, stomp.Header{Key: k, Value: v})
			}
		}
		h = append(h, stomp.Header{Key: "persistent", Value: "true"},
			stomp.Header{Key: attemptHeader, Value: "2"},
			stomp.Header{Key: "AMQ_SCHEDULED_DELAY", Value: strconv.FormatInt(max(delay.Milliseconds(), 1), 10)})
		if err := b.pub.Send(ctx, dest, h, m.Body); err != nil {
			return false, fmt.Errorf("stomp baseline: send copy: %w", err)
		}
		return false, nil
	})
}

// run publishes p.N messages and consumes them with handle, which says whether a delivery is
// final (counted towards p.N) once ACKed. A handle error leaves the delivery unacknowledged.
func (b *STOMPBaseline) run(ctx context.Context, queue string, p Params,
	handle func(context.Context, *stomp.Message) (final bool, err error),
) (Run, error) {
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	dest := destination(queue)
	sub, err := b.con.Subscribe(ctx, dest, stomp.SubscribeOptions{Ack: stomp.AckClientIndividual, Prefetch: p.Prefetch})
	if err != nil {
		return Run{}, fmt.Errorf("stomp baseline: subscribe: %w", err)
	}
	// Until the run ends cleanly, the queue may hold what it did not consume.
	b.mu.Lock()
	b.dirty[queue] = true
	b.mu.Unlock()

	lat := newLatencies(p.N)
	var acked atomic.Int64
	var ackErr atomic.Pointer[error]
	done := make(chan time.Time, 1)
	var wg sync.WaitGroup
	for range max(p.Concurrency, 1) {
		wg.Go(func() {
			for m := range sub.C() {
				final, err := handle(ctx, m)
				if err != nil {
					ackErr.CompareAndSwap(nil, &err)
					continue
				}
				if final {
					if v, ok := m.Header(tsHeader); ok {
						if ts, err := strconv.ParseInt(v, 10, 64); err == nil {
							lat.record(ts)
						}
					}
				}
				if err := b.ack(ctx, m); err != nil {
					ackErr.CompareAndSwap(nil, &err)
					continue
				}
				if final && acked.Add(1) == int64(p.N) {
					done <- time.Now()
				}
			}
		})
	}
	stopConsumer := func() {
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer ucancel()
		sub.Unsubscribe(uctx) //nolint:errcheck // the channel closes either way
		wg.Wait()
	}

	body := Body(p.BodySize)
	start := time.Now()
	pubErr := make(chan error, 1)
	var lastConfirm time.Time
	go func() {
		// A window of SENDs awaiting their RECEIPT: each waits in a goroutine of its own while
		// the next frames go out on the same connection.
		window := make(chan struct{}, max(p.Window, 1))
		var sends sync.WaitGroup
		var first atomic.Pointer[error]
		for i := range p.N {
			if first.Load() != nil {
				break
			}
			select {
			case window <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			h := []stomp.Header{
				{Key: "persistent", Value: "true"},
				{Key: "correlation-id", Value: "m-" + strconv.Itoa(i)},
				{Key: "content-type", Value: "application/x-protobuf"},
				{Key: tsHeader, Value: strconv.FormatInt(time.Now().UnixNano(), 10)},
			}
			sends.Go(func() {
				defer func() { <-window }()
				if err := b.pub.Send(ctx, dest, h, body); err != nil {
					err = fmt.Errorf("stomp baseline: send: %w", err)
					first.CompareAndSwap(nil, &err)
				}
			})
		}
		sends.Wait()
		lastConfirm = time.Now()
		switch e := first.Load(); {
		case e != nil:
			pubErr <- *e
		default:
			pubErr <- ctx.Err()
		}
	}()

	var end time.Time
	select {
	case end = <-done:
	case err := <-pubErr:
		if err != nil {
			stopConsumer()
			return Run{}, err
		}
		select {
		case end = <-done:
		case <-ctx.Done():
			stopConsumer()
			return Run{}, fmt.Errorf("stomp baseline: %d of %d acked: %w", acked.Load(), p.N, ctx.Err())
		}
		pubErr <- nil
	case <-ctx.Done():
		stopConsumer()
		return Run{}, fmt.Errorf("stomp baseline: %d of %d acked: %w", acked.Load(), p.N, ctx.Err())
	}
	if err := <-pubErr; err != nil {
		stopConsumer()
		return Run{}, err
	}
	stopConsumer()
	r := Run{Elapsed: end.Sub(start), Publish: lastConfirm.Sub(start)}
	r.P50, r.P99 = lat.percentiles()
	if e := ackErr.Load(); e != nil {
		r.Note = fmt.Sprintf("consumer error: %v", *e)
	} else {
		b.mu.Lock()
		delete(b.dirty, queue)
		b.mu.Unlock()
	}
	return r, nil
}

// ack acknowledges one delivery: written and not awaited, or with AckReceipt awaiting its RECEIPT.
func (b *STOMPBaseline) ack(ctx context.Context, m *stomp.Message) error {
	if b.AckReceipt {
		return b.con.Ack(ctx, m.AckID)
	}
	return b.con.Write(&stomp.Frame{Command: "ACK", Headers: []stomp.Header{{Key: "id", Value: m.AckID}}})
}
