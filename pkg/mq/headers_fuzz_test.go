package mq

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// headerValue makes an AMQP table value of the kind chosen by the fuzzer: every integer width the
// wire carries, and the types a foreign publisher might put where an integer belongs.
func headerValue(kind uint8, n int64, s string) (any, bool) {
	switch kind % 16 {
	case 0:
		return nil, false // absent
	case 1:
		return int8(n), true
	case 2:
		return int16(n), true
	case 3:
		return int32(n), true
	case 4:
		return n, true
	case 5:
		return int(n), true
	case 6:
		return uint8(n), true
	case 7:
		return uint16(n), true
	case 8:
		return uint32(n), true
	case 9:
		return s, true
	case 10:
		return float64(n), true
	case 11:
		return n%2 == 0, true
	case 12:
		return []any{n, s}, true
	case 13:
		return amqp.Table{"n": n}, true
	case 14:
		return []byte(s), true
	}
	return nil, true // present, nil
}

// deathValue is an x-death header as the broker writes it, or malformed.
func deathValue(kind uint8, n int64, s string) (any, bool) {
	switch kind % 6 {
	case 0:
		return nil, false
	case 1:
		return []any{amqp.Table{"time": time.Unix(n%(1<<40), 0), "reason": s, "count": n}}, true
	case 2:
		return []any{}, true
	case 3:
		return []any{s, n}, true
	case 4:
		return s, true
	}
	return []any{amqp.Table{"time": s}}, true
}

// FuzzHeaders: whatever headers a delivery carries (ours, the broker's, a foreign publisher's),
// reading them never panics, the attempt and redrive counts stay in their ranges (an integer
// header in range is read as it is), and the copies the port publishes carry none of the
// broker's headers and none of the port's bookkeeping where it must start afresh.
func FuzzHeaders(f *testing.F) {
	f.Add(uint8(3), int64(2), uint8(3), int64(1), uint8(1), int64(1_700_000_000), "rejected", "2025-01-01T00:00:00Z")
	f.Add(uint8(4), int64(-5), uint8(9), int64(0), uint8(3), int64(0), "\xff\x00", "not a time")
	f.Add(uint8(8), int64(1<<40), uint8(4), int64(1<<31), uint8(5), int64(-1), "", "")
	f.Add(uint8(9), int64(7), uint8(12), int64(7), uint8(4), int64(7), "7", "7")
	f.Fuzz(func(t *testing.T, attemptKind uint8, attempt int64, redrivenKind uint8, redriven int64, deathKind uint8, death int64, s, when string) {
		h := amqp.Table{hdrPublishTag: s, hdrDeadReason: s, hdrLastError: s, hdrFirstFailure: when, hdrDeadAt: when,
			"x-first-death-reason": s, "x-delivery-count": attempt}
		if v, ok := headerValue(attemptKind, attempt, s); ok {
			h[hdrAttempt] = v
		}
		if v, ok := headerValue(redrivenKind, redriven, s); ok {
			h[hdrRedriven] = v
		}
		if v, ok := deathValue(deathKind, death, s); ok {
			h["x-death"] = v
		}
		d := &amqp.Delivery{MessageId: s, Body: []byte(s), Headers: h}

		m := newMessage("route", d)
		if m.Attempt < 1 || m.Attempt > 1<<30 {
			t.Fatalf("attempt %d out of range", m.Attempt)
		}
		if n, ok := intHeader(h, hdrAttempt); ok && n >= 1 && n <= 1<<30 && int64(m.Attempt) != n {
			t.Fatalf("attempt header %d read as %d", n, m.Attempt)
		}
		if _, ok := m.Headers[hdrPublishTag]; ok {
			t.Fatal("the publish tag reached the handler")
		}

		dl := deadLetterOf(d)
		if dl.Attempts < 1 || dl.Attempts > 1<<30 || dl.Redriven < 0 || dl.Redriven > 1<<30 {
			t.Fatalf("dead letter counts out of range: %d attempts, %d redriven", dl.Attempts, dl.Redriven)
		}

		c := copyOf(d)
		for k := range c.Headers {
			if brokerHeader(k) || k == hdrPublishTag {
				t.Fatalf("copy carries %s", k)
			}
		}
		r := redriveCopy(d)
		for k := range bookkeeping {
			if _, ok := r.Headers[k]; ok && k != hdrRedriven { // x-redriven is set afresh, one more
				t.Fatalf("redrive copy carries %s", k)
			}
		}
		if n, ok := r.Headers[hdrRedriven].(int32); !ok || n < 1 || n > 1<<30 {
			t.Fatalf("redrive copy's %s is %v", hdrRedriven, r.Headers[hdrRedriven])
		}
	})
}
