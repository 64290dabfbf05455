package mqbench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Baseline is raw amqp091-go doing what the port does on its ack path, with nothing of the port's
// bookkeeping: one publishing connection with a confirm-mode channel, one consuming connection.
type Baseline struct {
	url      string
	pub, con *amqp.Connection
	pubCh    *amqp.Channel
	admin    *amqp.Channel // passive declares and deletes, on the consuming connection
	returned atomic.Int64
	drained  chan struct{}
	queues   []string // declared, deleted by Cleanup
}

// DialBaseline opens the baseline's two connections.
func DialBaseline(url, scope string) (*Baseline, error) {
	dial := func(purpose string) (*amqp.Connection, error) {
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName(scope + "/baseline-" + purpose)
		return amqp.DialConfig(url, amqp.Config{Heartbeat: 10 * time.Second, Properties: props})
	}
	b := &Baseline{url: url, drained: make(chan struct{})}
	var err error
	if b.pub, err = dial("publish"); err != nil {
		return nil, fmt.Errorf("baseline: dial: %w", err)
	}
	if b.con, err = dial("consume"); err != nil {
		b.pub.Close() //nolint:errcheck // already failing
		return nil, fmt.Errorf("baseline: dial: %w", err)
	}
	if b.pubCh, err = b.pub.Channel(); err == nil {
		err = b.pubCh.Confirm(false)
	}
	if err == nil {
		b.admin, err = b.con.Channel()
	}
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("baseline: channel: %w", err)
	}
	// mandatory publishes, like the port's: returns must be drained or the connection stalls.
	returns := b.pubCh.NotifyReturn(make(chan amqp.Return, 256))
	go func() {
		defer close(b.drained)
		for range returns {
			b.returned.Add(1)
		}
	}()
	return b, nil
}

// ServerVersion is the broker's version as it announced itself.
func (b *Baseline) ServerVersion() string {
	v, _ := b.pub.Properties["version"].(string)
	return v
}

// Close closes both connections.
func (b *Baseline) Close() {
	if b.pub != nil {
		b.pub.Close() //nolint:errcheck // done with it
	}
	if b.con != nil {
		b.con.Close() //nolint:errcheck // done with it
	}
}

// Declare declares a quorum queue with the arguments of the port's work queue (and the classic DLQ
// it dead-letters to, as the port's), so the broker does the same work per message for both. With holdTTL > 0 it
// also declares the holding queue "<queue>.hold", declared like the port's: a quorum queue whose
// x-message-ttl dead-letters its messages back to queue, at least once.
func (b *Baseline) Declare(queue string, holdTTL time.Duration) error {
	dlq := queue + ".dlq"
	quorum := func(extra amqp.Table) amqp.Table {
		args := amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int32(20)}
		for k, v := range extra {
			args[k] = v
		}
		return args
	}
	deadLetterTo := func(target string) amqp.Table {
		return amqp.Table{
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": target,
			"x-dead-letter-strategy":    "at-least-once",
			"x-overflow":                "reject-publish",
		}
	}
	decl := func(name string, args amqp.Table) error {
		b.queues = append(b.queues, name) // first: a failed declaration may still leave the queue
		if _, err := b.admin.QueueDeclare(name, true, false, false, false, args); err != nil {
			return fmt.Errorf("baseline: declare %q: %w", name, err)
		}
		return nil
	}
	if err := decl(dlq, amqp.Table{"x-queue-type": "classic"}); err != nil {
		return err
	}
	if err := decl(queue, quorum(deadLetterTo(dlq))); err != nil {
		return err
	}
	if holdTTL > 0 {
		args := deadLetterTo(queue)
		args["x-message-ttl"] = max(holdTTL.Milliseconds(), 1)
		if err := decl(HoldQueue(queue), quorum(args)); err != nil {
			return err
		}
	}
	return nil
}

// HoldQueue is the name of the baseline's holding queue for queue.
func HoldQueue(queue string) string { return queue + ".hold" }

// Consumers is the number of consumers the broker has on a queue.
func (b *Baseline) Consumers(queue string) (int, error) {
	q, err := b.admin.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Consumers, nil
}

// Cleanup deletes every queue Declare declared, on a channel of its own (and a connection of its
// own if the broker closed ours, e.g. after a failed declaration).
func (b *Baseline) Cleanup() error {
	if len(b.queues) == 0 {
		return nil
	}
	conn := b.con
	if conn == nil || conn.IsClosed() {
		c, err := amqp.Dial(b.url)
		if err != nil {
			return fmt.Errorf("baseline: cleanup: %w", err)
		}
		defer c.Close() //nolint:errcheck // throwaway
		conn = c
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("baseline: cleanup: %w", err)
	}
	defer ch.Close() //nolint:errcheck // throwaway
	var errs []error
	for _, q := range b.queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			errs = append(errs, fmt.Errorf("delete %q: %w", q, err))
		}
	}
	return errors.Join(errs...)
}

// Run publishes p.N messages with up to p.Window confirms in flight while p.Concurrency
// goroutines consume them from one channel with prefetch p.Prefetch, acking each one on its own.
func (b *Baseline) Run(ctx context.Context, queue string, p Params) (Run, error) {
	return b.run(ctx, queue, p, func(context.Context, *amqp.Delivery) (bool, error) { return true, nil })
}

// RunFail is Run with the port's failed path done by hand: a first delivery is copied to the
// holding queue with x-delivery-attempt 2, the copy's confirm awaited, then the original acked;
// the holding queue dead-letters the copy back after its TTL, and that second delivery is acked.
// Declare the queue with a holdTTL first.
func (b *Baseline) RunFail(ctx context.Context, queue string, p Params) (Run, error) {
	hold := HoldQueue(queue)
	return b.run(ctx, queue, p, func(ctx context.Context, d *amqp.Delivery) (bool, error) {
		if a, ok := d.Headers["x-delivery-attempt"].(int32); ok && a > 1 {
			return true, nil
		}
		h := make(amqp.Table, len(d.Headers)+1)
		for k, v := range d.Headers {
			h[k] = v
		}
		h["x-delivery-attempt"] = int32(2)
		dc, err := b.pubCh.PublishWithDeferredConfirmWithContext(ctx, "", hold, true, false, amqp.Publishing{
			Headers:      h,
			ContentType:  d.ContentType,
			DeliveryMode: amqp.Persistent,
			MessageId:    d.MessageId,
			Timestamp:    d.Timestamp,
			Body:         d.Body,
		})
		if err != nil {
			return false, fmt.Errorf("baseline: publish copy: %w", err)
		}
		select {
		case <-dc.Done():
		case <-ctx.Done():
			return false, ctx.Err()
		}
		if !dc.Acked() {
			return false, errors.New("baseline: copy nacked")
		}
		return false, nil
	})
}

// run publishes p.N messages and consumes them with handle, which says whether a delivery is
// final (counted towards p.N) once acked. A handle error leaves the delivery unacked.
func (b *Baseline) run(ctx context.Context, queue string, p Params,
	handle func(context.Context, *amqp.Delivery) (final bool, err error),
) (Run, error) {
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	returnedBefore := b.returned.Load()

	ch, err := b.con.Channel()
	if err != nil {
		return Run{}, fmt.Errorf("baseline: consumer channel: %w", err)
	}
	defer ch.Close() //nolint:errcheck // done with it
	if err := ch.Qos(p.Prefetch, 0, false); err != nil {
		return Run{}, fmt.Errorf("baseline: qos: %w", err)
	}
	const tag = "bench-baseline"
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return Run{}, fmt.Errorf("baseline: consume: %w", err)
	}
	lat := newLatencies(p.N)
	var acked atomic.Int64
	var ackErr atomic.Pointer[error]
	done := make(chan time.Time, 1)
	var wg sync.WaitGroup
	for range max(p.Concurrency, 1) {
		wg.Go(func() {
			for d := range deliveries {
				final, err := handle(ctx, &d)
				if err != nil {
					ackErr.CompareAndSwap(nil, &err)
					continue
				}
				if final {
					if ts, ok := tsOf(d.Headers); ok {
						lat.record(ts)
					}
				}
				if err := d.Ack(false); err != nil {
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
		ch.Cancel(tag, false) //nolint:errcheck // the channel closes right after either way
		wg.Wait()
	}

	body := Body(p.BodySize)
	start := time.Now()
	pubErr := make(chan error, 1)
	var lastConfirm time.Time
	go func() {
		inflight := make(chan *amqp.DeferredConfirmation, max(p.Window, 1))
		waited := make(chan error, 1)
		go func() {
			var err error
			for dc := range inflight {
				select {
				case <-dc.Done():
					if !dc.Acked() && err == nil {
						err = errors.New("baseline: publish nacked")
					}
				case <-ctx.Done():
					if err == nil {
						err = ctx.Err()
					}
				}
			}
			lastConfirm = time.Now()
			waited <- err
		}()
		var err error
		for i := range p.N {
			now := time.Now()
			var dc *amqp.DeferredConfirmation
			dc, err = b.pubCh.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
				Headers:      amqp.Table{tsHeader: now.UnixNano()},
				ContentType:  "application/x-protobuf",
				DeliveryMode: amqp.Persistent,
				MessageId:    "m-" + strconv.Itoa(i),
				Timestamp:    now.UTC(),
				Body:         body,
			})
			if err != nil {
				err = fmt.Errorf("baseline: publish: %w", err)
				break
			}
			inflight <- dc
		}
		close(inflight)
		if werr := <-waited; err == nil {
			err = werr
		}
		pubErr <- err
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
			return Run{}, fmt.Errorf("baseline: %d of %d acked: %w", acked.Load(), p.N, ctx.Err())
		}
		pubErr <- nil
	case <-ctx.Done():
		stopConsumer()
		return Run{}, fmt.Errorf("baseline: %d of %d acked: %w", acked.Load(), p.N, ctx.Err())
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
	}
	if n := b.returned.Load() - returnedBefore; n > 0 {
		r.Note = fmt.Sprintf("%d publishes returned", n)
	}
	return r, nil
}
