// Package client is the Go client SDK of the integrations platform: a thin layer over the
// gateway's gRPC API (integrations.gateway.v1.GatewayService) that calls as one application —
// its API key on every call — and speaks the generated types (Execution, Event, ... are aliases
// of them).
//
// What it offers:
//
//   - Invoke a capability, async (the default: answered pending, attempted and retried by the
//     platform) or Sync (one attempt inline, answered settled), with a payload given as a map, a
//     struct or JSON, and an IdempotencyKey that makes the call safe to repeat; InvokeAndWait
//     invokes and waits.
//   - WaitForSettlement polls an execution (with backoff) until IsFinal: SUCCEEDED, FAILED or
//     CANCELLED.
//   - Get, List (an iterator over every page, with filters), Cancel, Timeline.
//   - ListEvents (an iterator), GetEvent, RedeliverEvent, RedriveEvents.
//   - RegisterWebhook and RegisterGRPC make the application's consumer and answer the signing
//     secret; RotateSecret replaces it. Deliveries are verified with sdk/go/webhooks.
//   - Every refusal is an *Error: the status code, the ErrorInfo Reason, the BadRequest Fields,
//     the RetryDelay, and IsRetryable, which says whether the same call may be made again (an
//     invocation only with the same IdempotencyKey; never after ReasonOutcomePending, whose
//     execution ran and is to be read or waited for).
//
// Connecting: New dials with TLS verified against the system roots; WithTLS takes a
// configuration (a private CA), WithInsecure is for a gateway on loopback in development;
// NewWithConn takes a *grpc.ClientConn of the caller's. New and NewWithConn refuse an empty API
// key.
//
// A complete program: it registers a webhook receiver, invokes a capability, waits for it to
// settle and verifies the completion event it receives (against a development stack as the
// repository's `make run` starts it: gRPC on 127.0.0.1:9090, key dev-api-key-change-me).
//
//	package main
//
//	import (
//		"context"
//		"errors"
//		"fmt"
//		"log"
//		"net"
//		"net/http"
//		"sync/atomic"
//		"time"
//
//		"github.com/integrations-platform/integrations/sdk/go/client"
//		"github.com/integrations-platform/integrations/sdk/go/webhooks"
//	)
//
//	func main() {
//		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
//		defer cancel()
//		c, err := client.New("127.0.0.1:9090", "dev-api-key-change-me", client.WithInsecure())
//		if err != nil {
//			log.Fatal(err)
//		}
//		defer c.Close()
//
//		// The receiver: verify the raw body and headers before anything else. The awaited
//		// completion event is picked out by its idempotency key before the 2xx, so it is
//		// never acknowledged and then dropped.
//		const key = "order-42"
//		var verifier atomic.Pointer[webhooks.Verifier]
//		completed := make(chan *webhooks.Event, 1)
//		lis, err := net.Listen("tcp", "127.0.0.1:8099")
//		if err != nil {
//			log.Fatal(err)
//		}
//		go http.Serve(lis, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//			v := verifier.Load()
//			if v == nil {
//				http.Error(w, "not ready", http.StatusServiceUnavailable) // the platform retries
//				return
//			}
//			event, err := v.VerifyRequest(r)
//			if err != nil {
//				http.Error(w, "not verified", http.StatusUnauthorized) // the platform retries
//				return
//			}
//			if event.Type == webhooks.TypeExecutionCompleted && event.Data.IdempotencyKey == key {
//				select {
//				case completed <- event:
//				default: // at least once: a redelivery of the event handed over already
//				}
//			}
//			w.WriteHeader(http.StatusNoContent)
//		}))
//
//		consumer, err := c.RegisterWebhook(ctx, "http://"+lis.Addr().String()+"/webhook")
//		if err != nil {
//			log.Fatal(err)
//		}
//		verifier.Store(&webhooks.Verifier{Secrets: []string{consumer.GetSigningSecret()}})
//
//		type order struct {
//			ID    string `json:"id"`
//			Total int    `json:"total"`
//		}
//		e, err := c.InvokeAndWait(ctx, "dummy.echo", order{ID: "42", Total: 100}, client.IdempotencyKey(key))
//		var cerr *client.Error
//		switch {
//		case errors.As(err, &cerr) && cerr.Field() != "":
//			log.Fatalf("bad request: %s: %v", cerr.Field(), err)
//		case client.IsRetryable(err):
//			log.Fatalf("try again in %s (same idempotency key): %v", client.RetryDelay(err), err)
//		case err != nil:
//			log.Fatal(err)
//		}
//		fmt.Println("settled:", e.GetId(), e.GetStatus(), e.GetResult().AsMap())
//
//		select {
//		case event := <-completed:
//			fmt.Println("verified webhook:", event.ID, event.Data.ExecutionID, event.Data.Status, string(event.Data.Result))
//		case <-ctx.Done():
//			log.Fatal("no webhook: ", ctx.Err())
//		}
//	}
//
// Listing walks every page:
//
//	for e, err := range c.List(ctx, &client.ListExecutionsRequest{Capability: "dummy.echo", PageSize: 100}) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(e.GetId(), e.GetStatus())
//	}
package client
