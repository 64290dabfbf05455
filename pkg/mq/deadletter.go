package mq

import "time"

// DeadLetter is one message in a DLQ, as DeadLetters lists it.
type DeadLetter struct {
	ID      string         // AMQP message-id
	Body    []byte         // the payload
	Headers map[string]any // every header the message carries, the port's and the broker's
	// Reason is x-dead-reason ("rejected", "retry_exhausted"), or for a
	// message the broker dead-lettered itself its x-first-death-reason (e.g. "delivery_limit").
	Reason         string
	LastError      string    // x-last-error: the handler's error, empty when the broker dead-lettered it
	Attempts       int       // x-delivery-attempt: deliveries to a handler that counted, at least 1
	FirstFailureAt time.Time // x-first-failure-at; zero when unknown
	LastFailureAt  time.Time // x-last-failure-at; zero when unknown
	DeadAt         time.Time // x-dead-at, or the broker's x-death time
	SourceQueue    string    // x-source-queue, or the broker's x-first-death-queue
	// Redriven is how many times the message was redriven (x-redriven) before it came back to the
	// DLQ: Redrive resets the attempt budget, not this.
	Redriven int
}

// deadLetterFrom reads a dead letter's port headers, for every provider (headers decoded; see
// copyOrder.apply); a provider adds what its broker says of a message it dead-lettered itself.
func deadLetterFrom(id string, body []byte, headers map[string]any) DeadLetter {
	h := make(map[string]any, len(headers))
	for k, v := range headers {
		if k != hdrPublishTag {
			h[k] = v
		}
	}
	str := func(k string) string { s, _ := headers[k].(string); return s }
	ts := func(k string) time.Time {
		t, _ := time.Parse(time.RFC3339Nano, str(k))
		return t
	}
	return DeadLetter{
		ID:             id,
		Body:           append([]byte(nil), body...),
		Headers:        h,
		Reason:         str(hdrDeadReason),
		LastError:      str(hdrLastError),
		Attempts:       attemptOf(headers),
		FirstFailureAt: ts(hdrFirstFailure),
		LastFailureAt:  ts(hdrLastFailure),
		DeadAt:         ts(hdrDeadAt),
		SourceQueue:    str(hdrSourceQueue),
		Redriven:       redrivenOf(headers),
	}
}
