// Package outcome reports an attempt's outcome — to the settlement service, to the callback
// service, or to the database — with one set of rules, used by the platform's services and the
// adapter SDK alike:
//
//   - a retryable answer (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, a retryable ABORTED,
//     INTERNAL or UNKNOWN, which is what a transport failure looks like) is retried with
//     exponential backoff until the attempt's lease or deadline, never a fixed number of tries:
//     the outcome is the only record of work the provider did, and giving it up early makes the
//     platform run that work again once the attempt's lease expires;
//   - a refusal of the result itself (INVALID_ARGUMENT on it, e.g. NaN) is ResultRefused: the
//     caller reports a permanent protocol failure of the attempt instead;
//   - "already moved on" (ALREADY_SETTLED, STALE_ATTEMPT, STATUS_MISMATCH, NOT_FOUND,
//     NO_LONGER_APPLICABLE) is MovedOn: someone else decided, which is final and not an error;
//   - anything else is a refusal for good (Refused), returned with its error.
package outcome

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"
)

// Verdict is how a report ended.
type Verdict int

// The verdicts of Do.
const (
	// Recorded: the report was taken.
	Recorded Verdict = iota + 1
	// MovedOn: the execution or attempt had already moved on (settled, superseded, gone); the
	// report changed nothing and nothing more is to be done.
	MovedOn
	// ResultRefused: the result itself was refused; report a protocol failure instead.
	ResultRefused
	// Refused: refused for a reason retrying cannot change; the error says which.
	Refused
	// Expired: still failing when the lease or deadline came; the error is the last failure.
	Expired
)

func (v Verdict) String() string {
	switch v {
	case Recorded:
		return "recorded"
	case MovedOn:
		return "moved_on"
	case ResultRefused:
		return "result_refused"
	case Refused:
		return "refused"
	case Expired:
		return "expired"
	}
	return "unknown"
}

// Class is what an error means for a report: retry it, or end with a Verdict.
type Class int

// The classes of Classify.
const (
	Retry Class = iota + 1
	ClassMovedOn
	ClassResultRefused
	ClassRefused
)

// Reasons (ErrorInfo.reason) that say the execution or attempt has moved on.
var movedOnReasons = map[errorsv1.ErrorReason]bool{
	errorsv1.ErrorReason_ALREADY_SETTLED: true, errorsv1.ErrorReason_STALE_ATTEMPT: true,
	errorsv1.ErrorReason_STATUS_MISMATCH: true, errorsv1.ErrorReason_NO_LONGER_APPLICABLE: true,
}

// Classify applies the rules to a gRPC status error (a plain context error counts as
// DEADLINE_EXCEEDED: the call timed out, not the attempt).
func Classify(err error) Class {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return Retry
	}
	if movedOnReasons[rpcstatus.ErrorReason(err)] {
		return ClassMovedOn
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted,
		codes.Internal, codes.Unknown, codes.Canceled:
		// ABORTED without a moved-on reason is a transaction conflict: retryable by definition.
		return Retry
	case codes.NotFound, codes.FailedPrecondition:
		return ClassMovedOn
	case codes.InvalidArgument:
		if resultField(err) {
			return ClassResultRefused
		}
	}
	return ClassRefused
}

// resultField reports whether an INVALID_ARGUMENT is about the result: its field violation names
// it, or, with no field named, its message does.
func resultField(err error) bool {
	st, _ := status.FromError(err)
	named := false
	for _, d := range st.Details() {
		br, ok := d.(*errdetails.BadRequest)
		if !ok {
			continue
		}
		for _, v := range br.GetFieldViolations() {
			named = true
			if strings.Contains(v.GetField(), "result") {
				return true
			}
		}
	}
	if !named {
		return strings.Contains(st.Message(), "result")
	}
	return false
}

// Options tunes Do. The zero value is usable with Until set.
type Options struct {
	// Until is the attempt's lease or deadline: retrying stops there (with Expired). Zero means
	// only ctx bounds it.
	Until time.Time
	// CallTimeout bounds one try (default 5 s, and never past Until).
	CallTimeout time.Duration
	// InitialInterval and MaxInterval shape the backoff (defaults 100 ms and 2 s).
	InitialInterval, MaxInterval time.Duration
	// Classify decides what an error means (default: Classify, for gRPC status errors).
	Classify func(error) Class
	// Log receives a line per retry (nil: none).
	Log *zap.Logger
	// What names the report in logs, e.g. "settle".
	What string
}

// Do runs fn until it succeeds, the error is final by the rules, or Until (or ctx) ends it. The
// error is nil for Recorded and MovedOn.
func Do(ctx context.Context, o Options, fn func(ctx context.Context) error) (Verdict, error) {
	classify := o.Classify
	if classify == nil {
		classify = Classify
	}
	callTimeout := o.CallTimeout
	if callTimeout <= 0 {
		callTimeout = 5 * time.Second
	}
	log := o.Log
	if log == nil {
		log = zap.NewNop()
	}
	if !o.Until.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, o.Until)
		defer cancel()
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = cmpOr(o.InitialInterval, 100*time.Millisecond)
	b.MaxInterval = cmpOr(o.MaxInterval, 2*time.Second)

	verdict, last := Expired, error(nil)
	tries := 0
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		tries++
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := fn(cctx)
		cancel()
		if err == nil {
			verdict = Recorded
			return struct{}{}, nil
		}
		last = err
		switch classify(err) {
		case ClassMovedOn:
			verdict = MovedOn
			return struct{}{}, nil
		case ClassResultRefused:
			verdict = ResultRefused
		case ClassRefused:
			verdict = Refused
		default:
			return struct{}{}, err
		}
		return struct{}{}, backoff.Permanent(err)
	},
		backoff.WithBackOff(b),
		// Only Until and ctx bound the retries: v5's default gives up after 15 minutes.
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, next time.Duration) {
			log.Warn("outcome report failed; retrying", zap.String("report", o.What), zap.Int("tries", tries),
				zap.String("code", status.Code(err).String()), zap.Duration("backoff", next), zap.Error(err))
		}))
	switch verdict {
	case Recorded, MovedOn:
		if verdict == MovedOn {
			log.Info("outcome report refused: the execution already moved on", zap.String("report", o.What), zap.Error(last))
		}
		return verdict, nil
	case Expired:
		if last == nil {
			last = err
		}
		return Expired, last
	}
	return verdict, last
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
