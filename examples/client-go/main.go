// A client application in Go: it registers its webhook receiver as the application's consumer,
// invokes a capability asynchronously with an idempotency key, waits for the execution to settle,
// and receives the completion event, verified with the SDK's webhook helper.
//
//	INTEGRATIONS_GRPC_ADDR     the gateway's gRPC address (default 127.0.0.1:9090, make run's)
//	INTEGRATIONS_API_KEY       the application's API key (make run's: dev-api-key-change-me)
//	INTEGRATIONS_GRPC_CA_FILE  TLS to the gateway, verified against this PEM CA (default: no TLS)
//	INTEGRATIONS_GRPC_TLS      true: TLS to the gateway, verified against the system roots
//	RECEIVER_ADDR              where this program listens for webhooks (default 127.0.0.1:8099)
//	CAPABILITY                 the capability to invoke (default dummy.echo)
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/client"
	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	apiKey := os.Getenv("INTEGRATIONS_API_KEY")
	if apiKey == "" {
		return errors.New("INTEGRATIONS_API_KEY is not set (make run's dev application: dev-api-key-change-me)")
	}
	transport, err := transportOption()
	if err != nil {
		return err
	}
	c, err := client.New(env("INTEGRATIONS_GRPC_ADDR", "127.0.0.1:9090"), apiKey, transport)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()

	// The receiver, and the idempotency key that names the invocation whose completion event it
	// waits for: known before invoking, so the handler can pick that event out even if it comes
	// before Invoke has answered.
	key := "example-go-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var verifier atomic.Pointer[webhooks.Verifier]
	completed := make(chan *webhooks.Event, 1)
	lis, err := net.Listen("tcp", env("RECEIVER_ADDR", "127.0.0.1:8099"))
	if err != nil {
		return fmt.Errorf("listen for webhooks: %w", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: receiver(&verifier, key, completed, out)}
	go func() { _ = srv.Serve(lis) }()
	defer func() { _ = srv.Close() }()

	consumer, err := c.RegisterWebhook(ctx, "http://"+lis.Addr().String()+"/webhook")
	if err != nil {
		return fmt.Errorf("register the webhook: %w", err)
	}
	verifier.Store(&webhooks.Verifier{Secrets: []string{consumer.GetSigningSecret()}})
	fmt.Fprintf(out, "webhook registered: %s\n", consumer.GetWebhook().GetUrl())

	capability := env("CAPABILITY", "dummy.echo")
	type greeting struct {
		Hello string `json:"hello"`
	}
	e, err := c.Invoke(ctx, capability, greeting{Hello: "world"}, client.IdempotencyKey(key))
	if err != nil {
		var cerr *client.Error
		if errors.As(err, &cerr) && cerr.Field() != "" {
			return fmt.Errorf("bad request (%s): %w", cerr.Field(), err)
		}
		if client.IsRetryable(err) {
			return fmt.Errorf("try again in %s, with the same idempotency key: %w", client.RetryDelay(err), err)
		}
		return err
	}
	fmt.Fprintf(out, "invoked %s: execution %s %s\n", capability, e.GetId(), e.GetStatus())

	e, err = c.WaitForSettlement(ctx, e.GetId())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "settled: execution %s %s\n", e.GetId(), e.GetStatus())

	select {
	case event := <-completed:
		if event.Data.ExecutionID != e.GetId() {
			return fmt.Errorf("the completion event for idempotency key %s names execution %s, not %s", key, event.Data.ExecutionID, e.GetId())
		}
		detail := string(event.Data.Result)
		if event.Data.Failure != nil {
			detail = event.Data.Failure.Reason + ": " + event.Data.Failure.Message
		}
		fmt.Fprintf(out, "verified webhook %s: %s %s %s\n", event.ID, event.Type, event.Data.Status, detail)
		return nil
	case <-ctx.Done():
		return fmt.Errorf("no webhook for execution %s: %w", e.GetId(), ctx.Err())
	}
}

// receiver is the webhook receiver. It verifies the raw body and headers before anything else
// and answers 2xx only for what verified: anything else the platform delivers again later. The
// completion event of the invocation made with idempotency key goes to completed (capacity 1);
// the one event awaited is matched here, before the 2xx, so that it is never acknowledged and then
// dropped however many other events arrive meanwhile. Other verified events are acknowledged and
// ignored.
func receiver(verifier *atomic.Pointer[webhooks.Verifier], key string, completed chan<- *webhooks.Event, out io.Writer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := verifier.Load()
		if v == nil {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		event, err := v.VerifyRequest(r)
		if err != nil {
			fmt.Fprintf(out, "refused a delivery: %v\n", err)
			http.Error(w, "not verified", http.StatusUnauthorized)
			return
		}
		if event.Type == webhooks.TypeExecutionCompleted && event.Data.IdempotencyKey == key {
			select {
			case completed <- event:
			default:
				// Delivery is at least once: this is a redelivery of the one completion event,
				// which was handed over already (a real receiver deduplicates by event.ID).
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// transportOption is how to reach the gateway: plaintext (make run's loopback port), or TLS.
func transportOption() (client.Option, error) {
	if file := os.Getenv("INTEGRATIONS_GRPC_CA_FILE"); file != "" {
		pem, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("INTEGRATIONS_GRPC_CA_FILE: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("INTEGRATIONS_GRPC_CA_FILE: no PEM certificate in %s", file)
		}
		return client.WithTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}), nil
	}
	if os.Getenv("INTEGRATIONS_GRPC_TLS") == "true" {
		return client.WithTLS(&tls.Config{MinVersion: tls.VersionTLS12}), nil
	}
	return client.WithInsecure(), nil
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
