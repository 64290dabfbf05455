package mq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

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

// problem adds a problem to the diagnosis.
func (d *Diagnosis) problem(format string, args ...any) {
	d.Problems = append(d.Problems, fmt.Sprintf(format, args...))
}

// answered records a probe's round trip (rt), or why it failed (err): the answer's body, when it
// carries the answering process's name and counters, replaces this process's counters. An answer
// without them still proves the round trip.
func (d *Diagnosis) answered(rt time.Duration, body []byte, err error) {
	if err != nil {
		d.problem("%v", err)
		return
	}
	d.RoundTrip = rt
	var answer probeAnswer
	if json.Unmarshal(body, &answer) == nil && answer.By != "" {
		d.AnsweredBy, d.Counters = answer.By, answer.Counters
	}
}

// awaitAnswer waits up to timeout for the answer to a probe sent at start among replies (answer
// picks it out and gives its body), and says how long the round trip took.
func awaitAnswer[M any](ctx context.Context, replies <-chan M, start time.Time, timeout time.Duration,
	answer func(M) ([]byte, bool),
) (time.Duration, []byte, error) {
	wait := time.NewTimer(timeout)
	defer wait.Stop()
	for {
		select {
		case m, ok := <-replies:
			if !ok {
				return 0, nil, errors.New("round trip: the reply queue's subscription ended")
			}
			if body, ok := answer(m); ok {
				return time.Since(start), body, nil
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
