// Package deliver delivers completion events to each application's webhook, signed per the
// Standard Webhooks convention, recording every attempt. A failed delivery is retried by the
// message port's schedule (the events route's delays); past the last attempt the event is dead,
// and its message waits in the route's dead-letter queue.
package deliver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/safetext"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

// Deliverer posts events to webhooks.
type Deliverer struct {
	store  *store.Store
	box    *secret.Box
	client *http.Client
	log    *zap.Logger
}

// New returns a Deliverer. Unless allowPrivate, connections to private, loopback and link-local
// addresses are refused after name resolution, so a webhook URL cannot reach inside the cluster.
func New(st *store.Store, box *secret.Box, timeout time.Duration, allowPrivate bool, log *zap.Logger) *Deliverer {
	dialer := &net.Dialer{Timeout: timeout}
	if !allowPrivate {
		dialer.Control = refusePrivate
	}
	transport := &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 8, IdleConnTimeout: 90 * time.Second}
	client := &http.Client{Timeout: timeout, Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &Deliverer{store: st, box: box, client: client, log: log}
}

// refusePrivate runs after name resolution, on the address actually dialled, so a public name
// that resolves to a private address (DNS rebinding) is refused too.
func refusePrivate(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhook address %q: %w", address, err)
	}
	if !webhook.PublicAddress(ap.Addr()) {
		return fmt.Errorf("webhook address %s is not public", ap.Addr())
	}
	return nil
}

// Handle is the mq.Handler of the events route.
func (d *Deliverer) Handle(ctx context.Context, m *mq.Message) mq.Result {
	var n queuev1.EventNotice
	if err := proto.Unmarshal(m.Body, &n); err != nil || n.GetEventId() == "" {
		return mq.Reject(fmt.Errorf("malformed event notice %s", m.ID))
	}
	logger := d.log.With(log.EventID(n.GetEventId()), log.ApplicationID(n.GetApplicationId()), zap.Int("delivery_attempt", m.Attempt))
	ev, err := d.store.DeliveryGet(ctx, n.GetEventId())
	if errors.Is(err, store.ErrNotFound) {
		return mq.Reject(err)
	}
	if err != nil {
		return mq.Fail(err)
	}
	if ev.Status != "pending" {
		return mq.Ack() // a duplicate notice of a settled delivery
	}
	start := time.Now()
	code, deliverErr := d.post(ctx, ev)
	if ctx.Err() != nil {
		return mq.Result{} // shutting down: the broker redelivers
	}
	a := store.Attempt{StatusCode: code, Duration: time.Since(start), Outcome: "delivered"}
	// The event's own count decides the last attempt, not the message's: a duplicate notice or a
	// port-level retry after a database error must not add attempts or end the event early.
	last := int(ev.Attempts)+1 >= maxAttempts()
	if deliverErr != nil {
		a.Err = safetext.Error(deliverErr, 512)
		a.Outcome = "pending"
		if last {
			a.Outcome = "dead"
		}
	}
	if err := d.store.DeliveryRecord(ctx, ev.EventID, a); err != nil {
		return mq.Fail(err)
	}
	switch {
	case deliverErr == nil:
		logger.Info("event delivered", zap.Int("status_code", code), zap.Duration("duration", a.Duration))
		return mq.Ack()
	case last:
		logger.Warn("event dead after its last delivery attempt", zap.Int("status_code", code))
		return mq.Reject(deliverErr)
	default:
		logger.Info("event delivery failed; will retry", zap.Int("status_code", code), zap.String("error", a.Err))
		return mq.Fail(deliverErr)
	}
}

func maxAttempts() int {
	if routes.Events.Retry.MaxAttempts > 0 {
		return routes.Events.Retry.MaxAttempts
	}
	return len(routes.Events.Retry.Delays) + 1
}

func (d *Deliverer) post(ctx context.Context, ev *store.Delivery) (int, error) {
	if ev.ConsumerKind == nil || ev.Endpoint == nil || ev.SealedSecret == nil {
		return 0, errors.New("application has no consumer registered")
	}
	if *ev.ConsumerKind != "webhook" {
		return 0, fmt.Errorf("consumer kind %q is not supported", *ev.ConsumerKind)
	}
	signingSecret, err := d.box.Open(ev.SealedSecret)
	if err != nil {
		return 0, fmt.Errorf("open signing secret: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, *ev.Endpoint, bytes.NewReader(ev.Payload))
	if err != nil {
		return 0, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "integrations-event-router/1")
	if err := webhook.SetHeaders(req.Header, string(signingSecret), ev.EventID, time.Now(), ev.Payload); err != nil {
		return 0, err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("post webhook: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("webhook answered %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}
