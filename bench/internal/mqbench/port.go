package mqbench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/integrations-platform/integrations/pkg/mq"
)

// Port runs the message port's scenarios on one Broker.
type Port struct {
	B mq.Broker
	// Consumers reports the consumer count of a queue; used to start the clock only once Consume
	// has subscribed, as the baseline does.
	Consumers func(queue string) (int, error)
}

var errFirstAttempt = errors.New("bench: failing the first attempt on purpose")

// Ack publishes p.N messages with PublishAll (p.Publishers goroutines, batches of
// p.Window/p.Publishers) while Consume runs with
// p.Concurrency handlers that return mq.Ack(); done when the route's Acknowledged counter has
// grown by p.N.
func (pt *Port) Ack(ctx context.Context, route mq.Route, p Params) (Run, error) {
	lat := newLatencies(p.N)
	h := func(_ context.Context, m *mq.Message) mq.Result {
		if ts, ok := tsOf(m.Headers); ok {
			lat.record(ts)
		}
		return mq.Ack()
	}
	r, d, err := pt.run(ctx, route, p, h)
	if err != nil {
		return r, err
	}
	r.P50, r.P99 = lat.percentiles()
	r.Note = account(d, p.N, 0)
	return r, nil
}

// Fail is Ack with handlers that fail every message's first attempt (mq.Fail: a confirmed copy
// to the holding queue, then the ack) and ack its second, after the route's retry delay.
func (pt *Port) Fail(ctx context.Context, route mq.Route, p Params) (Run, error) {
	lat := newLatencies(p.N)
	h := func(_ context.Context, m *mq.Message) mq.Result {
		if m.Attempt == 1 {
			return mq.Fail(errFirstAttempt)
		}
		if ts, ok := tsOf(m.Headers); ok {
			lat.record(ts)
		}
		return mq.Ack()
	}
	r, d, err := pt.run(ctx, route, p, h)
	if err != nil {
		return r, err
	}
	r.P50, r.P99 = lat.percentiles()
	r.Note = account(d, p.N, p.N)
	return r, nil
}

// account checks the counters' deltas of a run add up.
func account(d mq.Counters, n, retried int) string {
	var off []string
	check := func(name string, got uint64, want int) {
		if got != uint64(want) {
			off = append(off, fmt.Sprintf("%s=%d (want %d)", name, got, want))
		}
	}
	check("confirmed", d.Confirmed, n)
	check("acknowledged", d.Acknowledged, n)
	check("retried", d.Retried, retried)
	check("dead-lettered", d.DeadLettered, 0)
	check("requeued", d.Requeued, 0)
	check("superseded", d.Superseded, 0)
	check("lost", d.Lost, 0)
	return strings.Join(off, " ")
}

func (pt *Port) run(ctx context.Context, route mq.Route, p Params, h mq.Handler) (Run, mq.Counters, error) {
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	before := pt.B.Counters(route.Name)

	cctx, stop := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() { consumed <- pt.B.Consume(cctx, route.Name, p.Concurrency, h) }()
	stopConsumer := func() error {
		stop()
		return <-consumed
	}
	if err := pt.awaitSubscribed(ctx, pt.B.QueueName(route.Name), consumed); err != nil {
		stopConsumer() //nolint:errcheck // already failing
		return Run{}, mq.Counters{}, err
	}

	// Publishers goroutines take batches of Window/Publishers in turn, so that at most Window
	// publishes await their confirms at once, as in the baseline, and publishing never stops to
	// wait for a whole batch's confirms.
	body := Body(p.BodySize)
	publishers := max(p.Publishers, 1)
	batch := max(p.Window/publishers, 1)
	start := time.Now()
	published := make(chan error, 1)
	var lastConfirm time.Time
	go func() {
		var next atomic.Int64
		errs := make(chan error, publishers)
		for range publishers {
			go func() {
				msgs := make([]mq.Outgoing, 0, batch)
				for {
					i := int(next.Add(int64(batch))) - batch
					if i >= p.N {
						errs <- nil
						return
					}
					msgs = msgs[:0]
					for j := i; j < min(i+batch, p.N); j++ {
						msgs = append(msgs, mq.Outgoing{
							ID:      "m-" + strconv.Itoa(j),
							Body:    body,
							Headers: map[string]any{tsHeader: time.Now().UnixNano()},
						})
					}
					for _, err := range pt.B.PublishAll(ctx, route.Name, msgs) {
						if err != nil {
							errs <- err
							return
						}
					}
				}
			}()
		}
		var first error
		for range publishers {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		lastConfirm = time.Now()
		published <- first
	}()

	acked := func() uint64 { return pt.B.Counters(route.Name).Acknowledged - before.Acknowledged }
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var end time.Time
	pubDone := false
	for end.IsZero() {
		select {
		case err := <-published:
			if err != nil {
				stopConsumer() //nolint:errcheck // already failing
				return Run{}, mq.Counters{}, err
			}
			pubDone = true
			published = nil
		case err := <-consumed:
			return Run{}, mq.Counters{}, fmt.Errorf("consume returned early: %v", err)
		case <-tick.C:
			if acked() >= uint64(p.N) {
				end = time.Now()
			}
		case <-ctx.Done():
			stopConsumer() //nolint:errcheck // already failing
			return Run{}, mq.Counters{}, fmt.Errorf("%d of %d acked: %w", acked(), p.N, ctx.Err())
		}
	}
	if !pubDone {
		if err := <-published; err != nil {
			stopConsumer() //nolint:errcheck // already failing
			return Run{}, mq.Counters{}, err
		}
	}
	if err := stopConsumer(); err != nil {
		return Run{}, mq.Counters{}, fmt.Errorf("consume: %w", err)
	}
	d := countersSince(pt.B.Counters(route.Name), before)
	return Run{Elapsed: end.Sub(start), Publish: lastConfirm.Sub(start)}, d, nil
}

// countersSince is what the run counted: after's counters less before's.
func countersSince(after, before mq.Counters) mq.Counters {
	return mq.Counters{
		Confirmed:    after.Confirmed - before.Confirmed,
		Acknowledged: after.Acknowledged - before.Acknowledged,
		Retried:      after.Retried - before.Retried,
		DeadLettered: after.DeadLettered - before.DeadLettered,
		Requeued:     after.Requeued - before.Requeued,
		Superseded:   after.Superseded - before.Superseded,
		Lost:         after.Lost - before.Lost,
	}
}

// awaitSubscribed waits until the broker lists a consumer on queue (Consume subscribes
// asynchronously).
func (pt *Port) awaitSubscribed(ctx context.Context, queue string, consumed <-chan error) error {
	for {
		n, err := pt.Consumers(queue)
		if err != nil {
			return fmt.Errorf("consumer count of %q: %w", queue, err)
		}
		if n > 0 {
			return nil
		}
		select {
		case err := <-consumed:
			return fmt.Errorf("consume returned before subscribing: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("waiting for the consumer on %q: %w", queue, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
