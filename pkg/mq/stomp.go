package mq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// stompDriver is the port's STOMP 1.2 driver (pkg/stomp underneath), proven on ActiveMQ Classic
// by the contract suite. A route is the destination /queue/<scope>.<route>, its dead letters
// /queue/<scope>.<route>.dlq; there are no holding queues: a retry or a deferral is a copy the
// broker schedules (AMQ_SCHEDULED_DELAY on Classic, _AMQ_SCHED_DELIVERY on Artemis) and that
// carries its due time, which the consumer holds to (see stompScheduleLead). One connection
// publishes (and copies, lists and moves dead letters); every Consume call has a connection of its
// own, so a consumer that must be recycled recycles nothing else.
type stompDriver struct {
	p        *port
	url      string   // without the port's own query parameters
	tls      *amqpTLS // nil for stomp://
	schedule string   // stompScheduleClassic or stompScheduleArtemis
	log      *zap.Logger

	// pubSem guards pub: holding it is the right to replace a dead publishing connection.
	pubSem chan struct{}
	pub    *stomp.Conn

	mu    sync.Mutex
	conns map[*stomp.Conn]bool // every connection of the port, closed by close
}

// The scheduled-delivery header a STOMP broker honours, chosen by the URL's schedule parameter.
const (
	// stompScheduleClassic: ActiveMQ Classic's AMQ_SCHEDULED_DELAY, milliseconds from now (the
	// broker needs schedulerSupport="true"). Measured: never early, up to ~0.5 s late.
	stompScheduleClassic = "classic"
	// stompScheduleArtemis: ActiveMQ Artemis's _AMQ_SCHED_DELIVERY, an absolute time in epoch
	// milliseconds. Not testable here (no Artemis runs on these machines); Classic ignores it.
	stompScheduleArtemis = "artemis"
)

// stompScheduleLead is how much sooner than a copy's due time the broker is asked to deliver it:
// ActiveMQ Classic's scheduler delivers 0.3 to 0.5 s after the time asked (measured, at every
// delay from 10 ms to 1.5 s), so a copy scheduled for its due time would arrive that much late. The
// copy carries its due time (hdrSTOMPDue) and the consumer holds an early arrival in the worker
// until then, so a copy is never handled early and is late by little more than the broker's
// lateness beyond the lead. A delay shorter than the lead is not scheduled at all: the copy goes
// to the work queue at once and is held until due.
const stompScheduleLead = 300 * time.Millisecond

// The port's own STOMP headers. Their names are identifiers, not hyphenated: ActiveMQ's selectors
// cannot name a header with a hyphen (measured), and Redrive and Discard select on hdrSTOMPID.
const (
	// hdrSTOMPID is the message's id (Message.ID): the broker's message-id is its own, and
	// Artemis mints a new one on redelivery.
	hdrSTOMPID = "mq_id"
	// hdrSTOMPSend identifies one SEND: a broker's redelivery of it keeps it, a copy of the
	// message (retry, requeue, duplicate) gets a new one. It is the identity of the "delivery
	// reissued" check.
	hdrSTOMPSend = "mq_send"
	// hdrSTOMPDue is when a scheduled copy is due, epoch milliseconds: the consumer holds an
	// earlier arrival until then.
	hdrSTOMPDue = "mq_due"
	// hdrSTOMPRequeued marks a copy that returned a delivery to the broker (Message.Redelivered) and
	// counts such returns, for the backstop (deadReasonDeliveryLimit).
	hdrSTOMPRequeued = "mq_requeued"
	// hdrSTOMPTypes names the headers whose values are not strings, and their types
	// ("x-delivery-attempt=i,flag=b"): STOMP headers are text.
	hdrSTOMPTypes = "mq_types"
	// hdrSTOMPProbe marks a diagnostic probe; its value is the probe's id.
	hdrSTOMPProbe = "mq_probe"
	// hdrSTOMPMarker marks a route's declaration marker (see stompMarker).
	hdrSTOMPMarker = "mq_marker"
)

// stompMarkerSuffix names the queue that holds a route's declaration marker: STOMP cannot ask a
// broker whether a queue exists (ActiveMQ creates one on first use), so Declare leaves one
// persistent message in "<scope>.<route>.declared" and the dead-letter operations of a route that
// was never declared in the scope fail, as RabbitMQ's 404 makes them fail.
const stompMarkerSuffix = ".declared"

// stompURLParams are the query parameters of a STOMP URL the port reads (and removes before
// dialing): the schedule header, and the TLS files and name of a stomp+ssl:// URL.
var stompURLParams = []string{"schedule", "cacertfile", "certfile", "keyfile", "server_name_indication"}

// dialSTOMP connects the STOMP provider's publishing connection. The URL may carry the port's own
// query parameters (stompURLParams): schedule=classic|artemis (default classic), and for
// stomp+ssl:// the TLS parameters of an amqps:// URL (see newSTOMPTLS).
func dialSTOMP(ctx context.Context, p *port) (*stompDriver, error) {
	u, err := url.Parse(p.cfg.URL)
	if err != nil {
		return nil, errors.New("mq: Config.URL is not a valid URL")
	}
	tlsCfg, err := newSTOMPTLS(u)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	schedule := q.Get("schedule")
	switch schedule {
	case "":
		schedule = stompScheduleClassic
	case stompScheduleClassic, stompScheduleArtemis:
	default:
		return nil, fmt.Errorf("mq: Config.URL's schedule parameter %q is not one of %q, %q", schedule,
			stompScheduleClassic, stompScheduleArtemis)
	}
	for _, k := range stompURLParams {
		q.Del(k)
	}
	if len(q) > 0 {
		return nil, fmt.Errorf("mq: Config.URL has query parameters the STOMP provider does not know: %v", slices.Sorted(maps.Keys(q)))
	}
	u.RawQuery = ""
	b := &stompDriver{
		p:        p,
		url:      u.String(),
		tls:      tlsCfg,
		schedule: schedule,
		log:      p.log,
		pubSem:   make(chan struct{}, 1),
		conns:    map[*stomp.Conn]bool{},
	}
	if _, err := b.publisher(ctx); err != nil {
		return nil, fmt.Errorf("mq: connect: %w", err)
	}
	return b, nil
}

// dial opens one STOMP connection. Its error never contains the URL (it carries the passcode).
func (b *stompDriver) dial(ctx context.Context, purpose string) (*stomp.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	opts := []stomp.Option{stomp.WithHeartBeat(heartbeat, heartbeat)}
	if b.tls != nil {
		opts = append(opts, stomp.WithTLS(b.tls.config()))
	}
	if wrap := b.hooks().wrapConn; wrap != nil {
		opts = append(opts, stomp.WithDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return wrap(purpose, c), nil
		}))
	}
	c, err := stomp.Dial(ctx, b.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s connection: %w", purpose, err)
	}
	b.mu.Lock()
	if b.isClosed() {
		b.mu.Unlock()
		c.Close(ctx) //nolint:errcheck // closing anyway
		return nil, ErrClosed
	}
	b.conns[c] = true
	b.mu.Unlock()
	return c, nil
}

// release closes a connection of the port (DISCONNECT, bounded) and forgets it.
func (b *stompDriver) release(c *stomp.Conn, within time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	c.Close(ctx) //nolint:errcheck // the broker returns what the connection held unacknowledged either way
	b.mu.Lock()
	delete(b.conns, c)
	b.mu.Unlock()
}

func (b *stompDriver) hooks() *testHooks { return b.p.hooks() }

func (b *stompDriver) isClosed() bool { return b.p.isClosed() }

// publisher returns the live publishing connection, dialing a new one if it died.
func (b *stompDriver) publisher(ctx context.Context) (*stomp.Conn, error) {
	select {
	case b.pubSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.p.closed:
		return nil, ErrClosed
	}
	defer func() { <-b.pubSem }()
	if b.isClosed() {
		return nil, ErrClosed
	}
	if b.pub != nil && !isDone(b.pub.Done()) {
		return b.pub, nil
	}
	if b.pub != nil {
		b.log.Info("mq publishing connection reconnecting", zap.Error(b.pub.Err()))
		b.release(b.pub, time.Second)
		b.pub = nil
	}
	c, err := b.dial(ctx, "publish")
	if err != nil {
		return nil, err
	}
	b.pub = c
	return c, nil
}

// dest is the STOMP destination of a scoped queue name.
func dest(queue string) string { return "/queue/" + queue }

// checkRoute refuses the route names whose queue would be another route's declaration marker.
func checkRoute(name string) error {
	if strings.HasSuffix(name, stompMarkerSuffix) {
		return fmt.Errorf("mq: route name %q would collide with a route's declaration marker: %w", name, ErrInvalidName)
	}
	return nil
}

// declare leaves each route's declaration marker in the broker (once): ActiveMQ creates the
// queues themselves on first use, and there are no holding queues to declare. The marker is what
// tells the dead-letter operations of another process that the route exists.
func (b *stompDriver) declare(ctx context.Context, tops []*topology) error {
	for _, t := range tops {
		if err := checkRoute(t.route); err != nil {
			return err
		}
	}
	for _, t := range tops {
		n, err := b.browseCount(ctx, t.queue+stompMarkerSuffix, 1)
		if err != nil {
			return fmt.Errorf("mq: declare %q: %w", t.route, err)
		}
		if n == 0 {
			if err := b.sendOwn(ctx, dest(t.queue+stompMarkerSuffix), map[string]string{hdrSTOMPMarker: t.route}, nil); err != nil {
				return fmt.Errorf("mq: declare %q: marker: %w", t.route, err)
			}
		}
	}
	return nil
}

// close closes every connection of the driver; the broker returns what they held
// unacknowledged.
func (b *stompDriver) close(ctx context.Context) error {
	b.mu.Lock()
	conns := make([]*stomp.Conn, 0, len(b.conns))
	for c := range b.conns {
		conns = append(conns, c)
	}
	b.mu.Unlock()
	within := time.Second
	if dl, ok := ctx.Deadline(); ok {
		within = min(within, time.Until(dl))
	}
	for _, c := range conns {
		b.release(c, within)
	}
	return nil
}
