package mq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// defaultDiagnoseTimeout is how long Diagnose waits for a consumer's answer when given no timeout.
const defaultDiagnoseTimeout = 2 * time.Second

// Diagnosis is the state of one route as Diagnose found it.
type Diagnosis struct {
	Route     string
	OK        bool          // no problems: every queue exists and a consumer answered the probe
	RoundTrip time.Duration // probe published (and confirmed) until its answer arrived; 0 when none came
	Messages  int           // ready messages in the work queue, before the probe
	Consumers int           // consumers of the work queue, in every process
	DLQ       int           // messages in the DLQ
	// Counters are the counters for the route of the process that answered the probe (named by
	// AnsweredBy, "host/pid"); this process's own when no consumer answered.
	Counters   Counters
	AnsweredBy string
	Problems   []string // what is wrong, one phrase each
}

// probeAnswer is the body of a probe's reply: who answered, and its counters for the route.
type probeAnswer struct {
	By       string   `json:"by"`
	Counters Counters `json:"counters"`
}

// String is the diagnosis in one line, e.g.
//
//	executions ok round_trip=3ms consumers=2 messages=0 dlq=0 published=10 confirmed=10 ...
//	executions FAIL: holding queue integrations.executions.retry.60000ms missing | consumers=2 ...
func (d Diagnosis) String() string {
	var sb strings.Builder
	sb.WriteString(d.Route)
	if d.OK {
		fmt.Fprintf(&sb, " ok round_trip=%s", d.RoundTrip.Round(10*time.Microsecond))
	} else {
		sb.WriteString(" FAIL: ")
		sb.WriteString(strings.Join(d.Problems, "; "))
		sb.WriteString(" |")
	}
	if d.AnsweredBy != "" {
		fmt.Fprintf(&sb, " answered_by=%s", d.AnsweredBy)
	}
	c := d.Counters
	fmt.Fprintf(&sb, " consumers=%d messages=%d dlq=%d published=%d confirmed=%d returned=%d"+
		" acknowledged=%d retried=%d dead_lettered=%d rejected=%d superseded=%d lost=%d requeued=%d"+
		" panicked=%d redriven=%d deferred=%d",
		d.Consumers, d.Messages, d.DLQ, c.Published, c.Confirmed, c.Returned, c.Acknowledged,
		c.Retried, c.DeadLettered, c.Rejected, c.Superseded, c.Lost, c.Requeued, c.Panicked, c.Redriven, c.Deferred)
	return sb.String()
}

// Diagnose checks each route, concurrently, and answers one Diagnosis per route, in order.
//
// For each route it checks passively that the work queue, every holding queue and the DLQ exist
// (a missing one is a failure: a missing holding queue or DLQ turns retries and dead letters into
// returned publishes, and the broker's own dead-lettering into silent drops). Then it runs a round
// trip through the route's real work queue: it publishes a probe (confirmed) carrying the
// x-mq-probe header and a reply-to naming an exclusive reply queue of this Broker, and waits up to
// timeout (default 2 s) for the answer. Whatever process consumes the route answers the probe in
// Consume itself, before and without any handler, and acks it without counting it. With no
// consumer the probe stays in the work queue until one comes, which then answers into the void and
// acks it.
func (b *RabbitMQ) Diagnose(ctx context.Context, routes []Route, timeout time.Duration) []Diagnosis {
	if timeout <= 0 {
		timeout = defaultDiagnoseTimeout
	}
	out := make([]Diagnosis, len(routes))
	var wg sync.WaitGroup
	for i, r := range routes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = b.diagnose(ctx, r, timeout)
		}()
	}
	wg.Wait()
	return out
}

func (b *RabbitMQ) diagnose(ctx context.Context, r Route, timeout time.Duration) (d Diagnosis) {
	d.Route = r.Name
	defer func() {
		if d.AnsweredBy == "" {
			d.Counters = b.Counters(r.Name)
		}
		d.OK = len(d.Problems) == 0
	}()
	problem := func(format string, args ...any) { d.Problems = append(d.Problems, fmt.Sprintf(format, args...)) }
	top, err := plan(b.cfg.Scope, b.cfg.TimeScale, r)
	if err != nil {
		problem("invalid route: %v", err)
		return d
	}
	conn, err := b.consumeConn(ctx)
	if err != nil {
		problem("no connection to the broker: %v", err)
		return d
	}
	work, workOK := b.checkQueue(conn, "work queue", top.queue, problem)
	d.Messages, d.Consumers = work.Messages, work.Consumers
	for _, q := range top.queues()[2:] {
		b.checkQueue(conn, "holding queue", q, problem)
	}
	dlq, _ := b.checkQueue(conn, "dead-letter queue", top.dlq, problem)
	d.DLQ = dlq.Messages
	if !workOK {
		return d // nothing to probe through
	}
	rt, answer, err := b.roundTrip(ctx, conn, top.queue, timeout)
	if err != nil {
		problem("%v", err)
		return d
	}
	d.RoundTrip = rt
	if answer != nil {
		d.AnsweredBy, d.Counters = answer.By, answer.Counters
	}
	return d
}

// checkQueue declares a queue passively on a throwaway channel: a missing queue closes the channel
// with 404, and must not take a shared channel with it.
func (b *RabbitMQ) checkQueue(conn *amqp.Connection, kind, name string, problem func(string, ...any)) (amqp.Queue, bool) {
	ch, err := conn.Channel()
	if err != nil {
		problem("check %s %s: open channel: %v", kind, name, err)
		return amqp.Queue{}, false
	}
	defer ch.Close() //nolint:errcheck // throwaway; already closed after a 404
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	var ae *amqp.Error
	switch {
	case err == nil:
		return q, true
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		problem("%s %s missing", kind, name)
	default:
		problem("check %s %s: %v", kind, name, err)
	}
	return amqp.Queue{}, false
}

// roundTrip publishes a probe to queue and waits for a consumer's answer on a reply queue of its
// own. The reply queue is classic by necessity: exclusive (it dies with this connection) and
// auto-deleted (with its consumer), which quorum queues cannot be.
func (b *RabbitMQ) roundTrip(ctx context.Context, conn *amqp.Connection, queue string, timeout time.Duration) (time.Duration, *probeAnswer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: open channel: %w", err)
	}
	defer ch.Close() //nolint:errcheck // takes the reply queue with it
	rq, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: declare reply queue: %w", err)
	}
	replies, err := ch.Consume(rq.Name, "", true, true, false, false, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: consume reply queue: %w", err)
	}
	id := uuid.NewString()
	probe := amqp.Publishing{
		Headers:       amqp.Table{hdrProbe: id},
		MessageId:     "mq-probe-" + id,
		CorrelationId: id,
		ReplyTo:       rq.Name,
		Timestamp:     time.Now().UTC(),
	}
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, publishTimeout)
	err = b.publishTo(pctx, "", queue, probe)
	cancel()
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: probe publish to %s: %w", queue, err)
	}
	wait := time.NewTimer(timeout)
	defer wait.Stop()
	for {
		select {
		case m, ok := <-replies:
			if !ok {
				return 0, nil, errors.New("round trip: reply channel closed")
			}
			if m.CorrelationId == id {
				rt := time.Since(start)
				var answer probeAnswer
				if json.Unmarshal(m.Body, &answer) != nil || answer.By == "" {
					return rt, nil, nil // an answer without counters still proves the round trip
				}
				return rt, &answer, nil
			}
		case <-wait.C:
			return 0, nil, fmt.Errorf("no consumer answered within %v", timeout)
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("round trip: %w", ctx.Err())
		}
	}
}

// processName names this process in a probe's answer: "host/pid".
var processName = func() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}()

// isProbe reports a Diagnose probe.
func isProbe(d *amqp.Delivery) bool {
	_, ok := d.Headers[hdrProbe].(string)
	return ok
}

// answerProbe replies to a probe and hands the owner its ack. The probe is worth nothing once
// answered, or once nobody waits for the answer (the reply queue is gone: the reply comes back
// unroutable), so it is acked either way; it is never given to the handler nor counted.
func (c *consumer) answerProbe(j *job) {
	s := settlement{job: j, verdict: verdict{act: actAck}, probe: true}
	if j.sub.dead.Load() {
		s.act = actNone
	} else if j.d.ReplyTo != "" {
		ctx, cancel := context.WithTimeout(c.ctx, publishTimeout)
		id, _ := j.d.Headers[hdrProbe].(string)
		body, _ := json.Marshal(probeAnswer{By: processName, Counters: c.st.snapshot()})
		reply := amqp.Publishing{
			Headers:       amqp.Table{hdrProbe: id},
			CorrelationId: id,
			Timestamp:     time.Now().UTC(),
			ContentType:   "application/json",
			Body:          body,
		}
		if err := c.b.publishTo(ctx, "", j.d.ReplyTo, reply); err != nil {
			c.log.Info("mq diagnostic probe answered into the void", zap.String("message_id", j.d.MessageId), zap.Error(err))
		}
		cancel()
	}
	select {
	case c.res <- s:
	case <-c.gone:
	}
}
