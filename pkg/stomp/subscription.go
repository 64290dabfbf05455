package stomp

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"sync"
)

// Message is one MESSAGE frame delivered to a subscription.
type Message struct {
	Subscription string // the subscription's id
	Destination  string
	MessageID    string // the broker's message-id (a redelivery may or may not keep it: see docs/decisions.md)
	AckID        string // what ACK/NACK take: the ack header, else (STOMP 1.0/1.1 brokers) message-id
	Headers      []Header
	Body         []byte
	// Generation is the [Conn.Generation] of the connection that received the message: only that
	// connection can settle it; once it is gone ([Conn.Done]) the broker redelivers the message.
	Generation uint64
}

// Header returns the value of the first header named key.
func (m *Message) Header(key string) (string, bool) { return header(m.Headers, key) }

// Value is Header without the presence flag.
func (m *Message) Value(key string) string {
	v, _ := m.Header(key)
	return v
}

// header is the value of the first of hs named key: STOMP 1.2 says the first of repeated headers
// counts.
func header(hs []Header, key string) (string, bool) {
	for _, h := range hs {
		if h.Key == key {
			return h.Value, true
		}
	}
	return "", false
}

// SubscribeOptions are a subscription's headers beyond its destination and id.
type SubscribeOptions struct {
	Ack      AckMode  // default AckClientIndividual
	Prefetch int      // ActiveMQ's activemq.prefetchSize when > 0: unacknowledged messages in flight
	Selector string   // a JMS selector over headers, e.g. "correlation-id = 'abc'"
	Browser  bool     // browser:true: list the queue without consuming it (ActiveMQ)
	Headers  []Header // any other header; it cannot replace id, destination or ack (the first wins)
}

// Subscription receives the MESSAGE frames of one SUBSCRIBE. Its channel never blocks the
// connection's reader: messages wait in the subscription's own queue until read. The channel is
// closed after Unsubscribe or when the connection ends; messages not yet read by then are
// dropped (the broker still holds them unacknowledged and redelivers them).
type Subscription struct {
	ID          string
	Destination string

	conn  *Conn
	c     chan *Message
	mu    sync.Mutex
	queue []*Message
	ended bool
	wake  chan struct{}
	stop  chan struct{}
}

// Subscribe sends SUBSCRIBE with a receipt and returns once the broker has confirmed it. When the
// RECEIPT does not come (an error wrapping [ErrOutcomeUnknown]), an UNSUBSCRIBE follows it, so
// the broker keeps no subscription the caller was told failed.
func (c *Conn) Subscribe(ctx context.Context, dest string, o SubscribeOptions) (*Subscription, error) {
	o.Ack = cmp.Or(o.Ack, AckClientIndividual)
	s := &Subscription{
		ID:          c.nextID("s"),
		Destination: dest,
		conn:        c,
		c:           make(chan *Message),
		wake:        make(chan struct{}, 1),
		stop:        make(chan struct{}),
	}
	f := &Frame{Command: "SUBSCRIBE", Headers: []Header{{"id", s.ID}, {"destination", dest}, {"ack", string(o.Ack)}}}
	if o.Prefetch > 0 {
		f.Headers = append(f.Headers, Header{"activemq.prefetchSize", strconv.Itoa(o.Prefetch)})
	}
	if o.Selector != "" {
		f.Headers = append(f.Headers, Header{"selector", o.Selector})
	}
	if o.Browser {
		f.Headers = append(f.Headers, Header{"browser", "true"})
	}
	f.Headers = append(f.Headers, o.Headers...)
	// Registered before the frame goes out: the first MESSAGE can arrive before the RECEIPT.
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.subs[s.ID] = s
	c.mu.Unlock()
	go s.pump()
	if err := c.Request(ctx, f); err != nil {
		c.dropSub(s.ID)
		if errors.Is(err, ErrOutcomeUnknown) {
			// The SUBSCRIBE may have reached the broker: end it there too (frames keep their
			// order), or the broker would dispatch to an id this client ignores and, with a client
			// ack, hold those messages unacknowledged for the connection's life. On a connection
			// that ended, nothing is written and nothing is held.
			_ = c.Write(&Frame{Command: "UNSUBSCRIBE", Headers: []Header{{"id", s.ID}}})
		}
		return nil, err
	}
	return s, nil
}

// C delivers the subscription's messages in the order the broker sent them.
func (s *Subscription) C() <-chan *Message { return s.c }

// Unsubscribe sends UNSUBSCRIBE and waits for its RECEIPT; the channel is closed either way. The
// broker redelivers what this subscription held unacknowledged.
func (s *Subscription) Unsubscribe(ctx context.Context) error {
	s.conn.dropSub(s.ID)
	return s.conn.Request(ctx, &Frame{Command: "UNSUBSCRIBE", Headers: []Header{{"id", s.ID}}})
}

func (c *Conn) dropSub(id string) {
	c.mu.Lock()
	s := c.subs[id]
	delete(c.subs, id)
	c.mu.Unlock()
	if s != nil {
		s.end()
	}
}

// dispatch hands a MESSAGE to its subscription; one for a subscription already dropped is
// ignored (the broker redelivers it, unacknowledged, after the UNSUBSCRIBE).
func (c *Conn) dispatch(f *Frame) {
	id := f.Value("subscription")
	c.mu.Lock()
	s := c.subs[id]
	c.mu.Unlock()
	if s == nil {
		return
	}
	m := &Message{
		Subscription: id,
		Destination:  f.Value("destination"),
		MessageID:    f.Value("message-id"),
		Headers:      f.Headers,
		Body:         f.Body,
		Generation:   c.generation,
	}
	m.AckID = cmp.Or(f.Value("ack"), m.MessageID)
	s.mu.Lock()
	if !s.ended {
		s.queue = append(s.queue, m)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Subscription) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.ended = true
		s.queue = nil
		close(s.stop)
	}
}

// pump moves queued messages to the channel, so a slow reader of C never stalls the connection's
// reader (and with it every RECEIPT).
func (s *Subscription) pump() {
	defer close(s.c)
	for {
		select {
		case <-s.stop:
			return
		case <-s.wake:
		}
		for {
			s.mu.Lock()
			if s.ended || len(s.queue) == 0 {
				s.mu.Unlock()
				break
			}
			m := s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			s.mu.Unlock()
			select {
			case s.c <- m:
			case <-s.stop:
				return
			}
		}
	}
}
