package mq

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// publish sends messages to queue, pipelined: every SEND is written (in order), then every
// RECEIPT awaited; a message with a delay is scheduled by the broker for its level (sendHeaders).
// A header STOMP cannot carry fails that message (ErrSTOMPHeader) and sends nothing for it; so do
// more headers or a larger body than a message of the port may carry.
func (b *stompDriver) publish(ctx context.Context, queue string, msgs []envelope) ([]sendResult, error) {
	conn, err := b.publisher(ctx)
	if err != nil {
		return nil, err
	}
	sent := make([]sendResult, len(msgs))
	receipts := make([]*stomp.Receipt, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		hs, err := b.sendHeaders(m.id, m.contentType, m.headers, m.delay, now)
		switch {
		case err != nil:
		case len(m.headers) > stompMaxHeaders-len(bookkeeping):
			err = fmt.Errorf("%d headers, over the %d an application message may carry over STOMP (its copies add the port's): %w",
				len(m.headers), stompMaxHeaders-len(bookkeeping), ErrSTOMPHeader)
		case len(m.body) > stompMaxBody:
			err = fmt.Errorf("body of %d bytes, over the %d a STOMP message of the port may carry", len(m.body), stompMaxBody)
		}
		if err != nil {
			sent[i].err = err
			continue
		}
		receipts[i] = conn.SendAsync(dest(queue), hs, m.body)
		sent[i].written = true
	}
	for i, r := range receipts {
		if r != nil {
			sent[i].err = r.Wait(ctx)
		}
	}
	return sent, nil
}

// sendHeaders are a SEND's headers: the message's (h, encoded), persistent (ActiveMQ's STOMP
// default is not), its id, a fresh send id, and for a delay its due time and the broker's schedule
// header (see stompScheduleLead).
func (b *stompDriver) sendHeaders(id, contentType string, h map[string]any, delay time.Duration, now time.Time) ([]stomp.Header, error) {
	hs, err := stompHeaders(h)
	if err != nil {
		return nil, err
	}
	if err := stompText("message id", id); err != nil {
		return nil, err
	}
	if err := stompText("content type", contentType); err != nil {
		return nil, err
	}
	hs = append(hs,
		stomp.Header{Key: "persistent", Value: "true"},
		stomp.Header{Key: "content-type", Value: contentType},
		stomp.Header{Key: hdrSTOMPID, Value: id},
		stomp.Header{Key: hdrSTOMPSend, Value: uuid.NewString()},
	)
	if delay > 0 {
		// Rounded up to the millisecond: the hold must not let a copy through a fraction early.
		due := now.Add(delay).Add(time.Millisecond - 1).UnixMilli()
		hs = append(hs, stomp.Header{Key: hdrSTOMPDue, Value: strconv.FormatInt(due, 10)})
		if ahead := delay - stompScheduleLead; ahead >= time.Millisecond {
			if b.schedule == stompScheduleArtemis {
				hs = append(hs, stomp.Header{Key: "_AMQ_SCHED_DELIVERY", Value: strconv.FormatInt(now.Add(ahead).UnixMilli(), 10)})
			} else {
				hs = append(hs, stomp.Header{Key: "AMQ_SCHEDULED_DELAY", Value: strconv.FormatInt(ahead.Milliseconds(), 10)})
			}
		}
	}
	return hs, nil
}

// stompText checks a value the port writes into a header of its own.
func stompText(what, v string) error {
	if _, err := stompHeaders(map[string]any{"v": v}); err != nil {
		return fmt.Errorf("%s: not UTF-8 text without NUL: %w", what, ErrSTOMPHeader)
	}
	return nil
}

// sendOwn sends a message of the port's own (a marker, a probe, a probe's answer) to destination
// and waits for its RECEIPT. It is not counted.
func (b *stompDriver) sendOwn(ctx context.Context, destination string, headers map[string]string, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	conn, err := b.publisher(ctx)
	if err != nil {
		return err
	}
	hs := []stomp.Header{{Key: "persistent", Value: "true"}}
	for k, v := range headers {
		hs = append(hs, stomp.Header{Key: k, Value: v})
	}
	return conn.Send(ctx, destination, hs, body)
}

// sendCopy sends a copy the rules or Redrive ordered (its headers ready) to destination, and
// waits for its RECEIPT: nil only once the broker has it. The test hooks around the write let
// tests withhold that RECEIPT.
func (b *stompDriver) sendCopy(ctx context.Context, destination string, hs []stomp.Header, body []byte) error {
	conn, err := b.publisher(ctx)
	if err != nil {
		return err
	}
	r := writeCopy(b.hooks(), destination, func() *stomp.Receipt { return conn.SendAsync(destination, hs, body) })
	return r.Wait(ctx)
}
