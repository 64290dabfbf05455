// Package adapter is the Go SDK for writing an adapter, the service that does a capability's
// provider work for the integrations platform: a Handler turns one attempt's Request into a
// Result, and the Server does the rest — the AdapterService gRPC surface, panic containment, and
// for long work (Later) the Accepted answer, automatic lease renewal, and delivery of the final
// outcome through AdapterCallbackService.
//
// A complete adapter:
//
//	h := func(ctx context.Context, req *adapter.Request) adapter.Result {
//		if req.Payload["to"] == nil {
//			return adapter.Fail(adapter.ClassPermanent, "bad_request", "to is required", false)
//		}
//		return adapter.Later(time.Minute, func(ctx context.Context, cb *adapter.Callbacks) adapter.Result {
//			_ = cb.ReportProgress(ctx, map[string]any{"percent": 10})
//			return adapter.Complete(map[string]any{"sent": true})
//		})
//	}
//	keys, err := platformtoken.ParsePublicKeys(os.Getenv("INTEGRATIONS_PLATFORM_PUBLIC_KEYS"))
//	...
//	s, err := adapter.New(h, adapter.Options{
//		CallbackAddr: "callbacks.internal:9093", Credential: cred, Logger: log,
//		// TLS to the callback service. Without transport credentials here the SDK dials
//		// plaintext, which suits only a callback service on loopback or in a trusted
//		// private network.
//		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(
//			credentials.NewTLS(&tls.Config{RootCAs: callbackCAs, MinVersion: tls.VersionTLS12}))},
//		AdapterID: "my-adapter", PlatformKeys: keys, // only the platform's calls are served
//	})
//	...
//	s.Register(grpcServer)
//	defer s.Close()
//
// The callback connection is plaintext by default (Options.DialOptions says how to give it TLS):
// the adapter's credential and every outcome cross it, so anywhere but on loopback or in a trusted
// private network give it TLS credentials.
//
// The protocol this package implements — every RPC and field, what each answer costs, the
// platform token and the request digest at byte level, the refusal marker — is written in the
// adapter protocol (docs/adapter-protocol.md in the repository), with language-neutral test
// vectors in the platformtoken package's testdata/vectors.json. A refused token is answered with
// platformtoken.RefusalStatus, the marker built by construction; platformtoken.ReadRefusal checks
// one, as the platform reads it.
package adapter

import (
	"context"
	"time"
)

// Failure classes the platform understands. A class is data: the gateway records it as the
// execution's failure class, and retries only failures marked retryable.
const (
	ClassTransient   = "transient"
	ClassPermanent   = "permanent"
	ClassTimeout     = "timeout"
	ClassUnavailable = "unavailable"
	// ClassProtocol is the SDK's class for an outcome the platform could not take (a result it
	// refused): the adapter broke the protocol, and retrying would not change it.
	ClassProtocol = "protocol"
)

// Modes of an execution, as found in Request.Mode.
const (
	// ModeAsync executions may answer Later and finish through callbacks.
	ModeAsync = "async"
	// ModeSync executions are settled by the gateway from the answer of the call itself, so
	// the SDK runs Later work inline for them (see Later).
	ModeSync = "sync"
)

// Request is one attempt of an execution, as given to a Handler.
type Request struct {
	ExecutionID string
	// Attempt counts from 1; it is stable across redeliveries of the same attempt, so a
	// handler can use (ExecutionID, Attempt) as an idempotency key towards its provider.
	Attempt    int32
	Capability string
	// Payload is the client's payload as decoded JSON: numbers are float64.
	Payload map[string]any
	// Deadline is when the attempt must end, on this host's clock (counted from the time left the
	// platform measured); zero if the platform set none.
	Deadline time.Time
	// Mode is ModeAsync or ModeSync.
	Mode string
}

// Handler does the provider work of one attempt. ctx ends when the call's deadline passes, the
// caller goes away, or the platform cancels the execution (context.Cause is then ErrCancelled). A panic is contained and answered as a permanent failure.
type Handler func(ctx context.Context, req *Request) Result

type resultKind int

const (
	kindNone resultKind = iota // the zero Result: a handler bug, answered as a failure
	kindCompleted
	kindFailed
	kindLater
)

// Result is a handler's answer. Build one with Complete, Fail or Later; the zero Result is
// invalid and answered as a permanent failure.
type Result struct {
	kind resultKind

	result map[string]any

	class, code, message string
	retryable            bool
	retryAfter           time.Duration

	lease time.Duration
	later func(ctx context.Context, cb *Callbacks) Result
}

// Complete is a successful outcome carrying result, which must be representable as JSON.
func Complete(result map[string]any) Result {
	return Result{kind: kindCompleted, result: result}
}

// Fail is an unsuccessful outcome. class is one of the Class constants (or another class the
// platform records as-is), code is the provider's own error code if any, and retryable says
// whether another attempt could succeed. message is stored and shown to the client, so it must
// not carry secrets.
func Fail(class, code, message string, retryable bool) Result {
	return Result{kind: kindFailed, class: class, code: code, message: message, retryable: retryable}
}

// RetryAfter returns a copy of a Fail result asking that the next attempt start no earlier than
// d from now, e.g. from the provider's Retry-After header. It has no effect on other results.
func (r Result) RetryAfter(d time.Duration) Result {
	if r.kind == kindFailed {
		r.retryAfter = d
	}
	return r
}

// DefaultLease is the lease used by Later when given none.
const DefaultLease = 30 * time.Second

// Later is the answer for long work. For an async execution the Server answers Accepted(lease)
// at once and runs fn in the background; while fn runs, the lease is renewed every third of
// the lease (see Callbacks.RenewLease), and fn's Result is then delivered through the Complete
// callback. fn's ctx ends at the attempt's deadline, when the Server shuts down, or when the
// platform refuses a renewal because the attempt is over (context.Cause is then
// ErrAttemptGone), or when the platform cancels the execution (AdapterService.Cancel;
// context.Cause is then ErrCancelled). In the last two cases no outcome is sent.
//
// For a sync execution, where callbacks are refused because the gateway settles it from the
// call's answer, fn runs inline within the call and its Result is the answer; the Callbacks it
// gets do nothing.
//
// A lease of zero or less means DefaultLease.
func Later(lease time.Duration, fn func(ctx context.Context, cb *Callbacks) Result) Result {
	if lease <= 0 {
		lease = DefaultLease
	}
	return Result{kind: kindLater, lease: lease, later: fn}
}
