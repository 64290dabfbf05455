package stack

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

// Event is one webhook delivery the receiver got.
type Event struct {
	At     time.Time // when the request arrived
	Header http.Header
	Body   []byte
	// VerifyErr is the signature check's outcome (nil: signed with the application's secret).
	VerifyErr error
	// Status is what the receiver answers: 204, or 500 for a delivery it fails on purpose
	// (SetFailRate).
	Status int
}

// Receiver is the application's webhook consumer: it verifies every delivery's signature
// (Standard Webhooks, pkg/webhook), counts, hands each to OnEvent if set, and answers 204.
type Receiver struct {
	URL string

	received atomic.Int64
	rejected atomic.Int64  // signature did not verify
	failed   atomic.Int64  // answered 500 on purpose
	failRate atomic.Uint64 // math.Float64bits of the share of deliveries answered 500
	srv      *http.Server
	mu       sync.RWMutex
	secret   string
	onEvent  func(Event)
}

// NewReceiver serves a receiver on a free loopback port.
func NewReceiver() (*Receiver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Receiver{URL: "http://" + l.Addr().String() + "/webhook"}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(l) }()
	return r, nil
}

// registerReceiver serves a Receiver and registers it as the dev application's consumer through
// the gateway's API.
func (s *Stack) registerReceiver(ctx context.Context) error {
	var err error
	if s.Receiver, err = NewReceiver(); err != nil {
		return err
	}
	conn, err := s.Dial("gateway", "")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := gatewayv1.NewGatewayServiceClient(conn).SetConsumer(grpcx.WithBearer(cctx, s.APIKey),
		&gatewayv1.SetConsumerRequest{Consumer: &gatewayv1.SetConsumerRequest_Webhook{
			Webhook: &gatewayv1.WebhookConsumer{Url: s.Receiver.URL},
		}})
	if err != nil {
		return fmt.Errorf("register the webhook receiver: %w", err)
	}
	s.SigningSecret = resp.GetSigningSecret()
	s.Receiver.SetSecret(s.SigningSecret)
	return nil
}

// SetSecret sets the signing secret deliveries are verified with.
func (r *Receiver) SetSecret(secret string) {
	r.mu.Lock()
	r.secret = secret
	r.mu.Unlock()
}

// OnEvent sets (nil: clears) a function called with every delivery, from the serving goroutine.
func (r *Receiver) OnEvent(f func(Event)) {
	r.mu.Lock()
	r.onEvent = f
	r.mu.Unlock()
}

// SetFailRate makes the receiver answer a share (0..1) of deliveries, at random, with 500, as a
// consumer having a bad day would.
func (r *Receiver) SetFailRate(share float64) { r.failRate.Store(math.Float64bits(share)) }

// Failed is the number of deliveries answered 500 on purpose.
func (r *Receiver) Failed() int64 { return r.failed.Load() }

// Received is the number of deliveries so far; Rejected of those whose signature did not verify.
func (r *Receiver) Received() int64 { return r.received.Load() }

// Rejected is the number of deliveries whose signature did not verify.
func (r *Receiver) Rejected() int64 { return r.rejected.Load() }

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.RLock()
	secret, on := r.secret, r.onEvent
	r.mu.RUnlock()
	ev := Event{At: at, Header: req.Header, Body: body, Status: http.StatusNoContent}
	if share := math.Float64frombits(r.failRate.Load()); share > 0 && rand.Float64() < share {
		ev.Status = http.StatusInternalServerError
		r.failed.Add(1)
	}
	if secret != "" {
		ev.VerifyErr = webhooks.Verifier{Secrets: []string{secret}, Tolerance: 5 * time.Minute, Now: func() time.Time { return at }}.Verify(req.Header, body)
	}
	r.received.Add(1)
	if ev.VerifyErr != nil {
		r.rejected.Add(1)
	}
	if on != nil {
		on(ev)
	}
	w.WriteHeader(ev.Status)
}

// Close stops serving.
func (r *Receiver) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}
