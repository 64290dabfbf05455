package execution

import (
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// OutcomeKind is the shape of an adapter's answer.
type OutcomeKind int

// The kinds of outcome.
const (
	OutcomeCompleted OutcomeKind = iota + 1
	OutcomeFailed
	OutcomeAccepted
)

// Outcome is an adapter's answer to one attempt, as the lifecycle takes it: the platform's
// adapter client (pkg/adaptercall) makes one of each call, the settlement reporter hands it on.
type Outcome struct {
	Kind OutcomeKind
	// Result, for Completed.
	Result *structpb.Struct
	// Failure (class, code, message), Retryable and RetryAfter, for Failed.
	Failure    Failure
	Retryable  bool
	RetryAfter time.Duration
	// Lease, for Accepted (0: the capability's default).
	Lease time.Duration
	// Cause is the transport's own error when the call got no answer of the adapter's, for our
	// logs only: the stored Failure says it in words that name no address.
	Cause error
	// NotSent, for Failed: the adapter could not be reached and provably nothing of the request
	// went out (see Pool.Execute), so no provider work can have started.
	NotSent bool
	// Refused, for Failed (always with NotSent): the adapter's SDK refused the platform's token
	// before doing anything (its answer carries the TokenRefusedReason marker) — the signing key
	// and the adapter's public keys disagree, or the adapter id. A configuration fault that an
	// operator must see; the attempt is not spent (see Pool.Execute).
	Refused bool
	// Replayed, for Failed (never with NotSent): the adapter's SDK refused the token as used
	// before. The platform signs a new token for every call, so another party used it first — a
	// captured token, a possible attack, not a configuration fault — with this very request: the
	// work may have run, and the attempt is spent.
	Replayed bool
	// MalformedRefusal, for Failed: the adapter answered something meant as the token-refusal
	// marker that is not a well-formed one (platformtoken.ReadRefusal), in words for the log. A
	// marker not taken is an ordinary failure and spends the attempt (Refused and Replayed are
	// false); one taken despite a bad check has Refused or Replayed set. The adapter's author must
	// hear of it: the callers log it at warning level.
	MalformedRefusal string
}
