package chaos

import (
	"context"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/e2e/stack"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
)

// deadLetters reads (without taking) every message of the run's dead-letter queues and sorts
// them into explained — the execution or event it names ended anyway (settled; delivered or
// dead), so the dead letter is a copy the platform recovered from elsewhere — and unexplained.
// The messages are fetched unacknowledged and put back when the channel closes.
func deadLetters(ctx context.Context, st *stack.Stack, amqpURL string, qs []queue) (explained int, unexplained []string, err error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return 0, nil, fmt.Errorf("read the dead letters: %w", err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return 0, nil, fmt.Errorf("read the dead letters: %w", err)
	}
	defer func() { _ = ch.Close() }()
	for _, q := range qs {
		if q.messages == 0 || !strings.HasSuffix(q.name, ".dlq") {
			continue
		}
		for range q.messages {
			d, ok, err := ch.Get(q.name, false)
			if err != nil {
				return explained, unexplained, fmt.Errorf("read %s: %w", q.name, err)
			}
			if !ok {
				break
			}
			why, ended := explain(ctx, st, q.name, d.Body)
			if ended {
				explained++
			} else {
				unexplained = append(unexplained, q.name+": "+why)
			}
		}
	}
	return explained, unexplained, nil
}

func explain(ctx context.Context, st *stack.Stack, queue string, body []byte) (string, bool) {
	var ev queuev1.EventNotice
	if strings.Contains(queue, ".events") {
		if err := proto.Unmarshal(body, &ev); err == nil && ev.GetEventId() != "" {
			var status string
			if err := st.DB.QueryRow(ctx, `SELECT delivery_status FROM integration_events WHERE id = $1`, ev.GetEventId()).Scan(&status); err != nil {
				return fmt.Sprintf("event %s: %v", ev.GetEventId(), err), false
			}
			return fmt.Sprintf("event %s is %s", ev.GetEventId(), status), status != "pending"
		}
	}
	var d queuev1.ExecutionDispatch
	if err := proto.Unmarshal(body, &d); err == nil && d.GetExecutionId() != "" {
		var settled bool
		if err := st.DB.QueryRow(ctx, `SELECT settled_at IS NOT NULL FROM executions WHERE id = $1`, d.GetExecutionId()).Scan(&settled); err != nil {
			return fmt.Sprintf("execution %s: %v", d.GetExecutionId(), err), false
		}
		return fmt.Sprintf("execution %s attempt %d (settled: %v)", d.GetExecutionId(), d.GetAttempt(), settled), settled
	}
	return fmt.Sprintf("a message of %d bytes the suite cannot read", len(body)), false
}
