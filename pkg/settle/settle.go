// Package settle reports an adapter's answer to the settlement service, with the outcome reporter's
// rules (sdk/go/outcome): the gateway's sync path and the execution-consumer share it.
package settle

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/execution"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/sdk/go/outcome"
)

// Attempt names the attempt an outcome belongs to and until when it may be reported.
type Attempt struct {
	ExecutionID string
	Attempt     int32
	// Until is the attempt's lease or deadline (the later of what the platform will still take
	// from this reporter): reports are retried until then.
	Until time.Time
}

// Settler reports an adapter's answer to the settlement service.
type Settler struct {
	Client settlementv1.SettlementServiceClient
	Log    *zap.Logger
}

// Report hands out to the settlement service: Completed settles SUCCEEDED; Failed goes to
// FailAttempt, which schedules the next attempt or settles FAILED; Accepted must be handled by the
// caller (only the consumer can take it; a sync caller passes it as a protocol failure). A result
// the settlement service refuses (e.g. NaN in it) becomes a permanent protocol failure of the
// attempt, reported through FailAttempt.
//
// The execution is returned as settled (or sent back to pending) for outcome.Recorded; it is nil for the
// other verdicts.
func (s Settler) Report(ctx context.Context, a Attempt, out execution.Outcome) (*executionv1.Execution, outcome.Verdict, error) {
	log := s.Log
	if log == nil {
		log = zap.NewNop()
	}
	o := outcome.Options{Until: a.Until, Log: log}
	if out.Kind == execution.OutcomeCompleted {
		var e *executionv1.Execution
		o.What = "settle"
		v, err := outcome.Do(ctx, o, func(ctx context.Context) error {
			resp, err := s.Client.Settle(ctx, &settlementv1.SettleRequest{
				ExecutionId: a.ExecutionID, Attempt: a.Attempt,
				FromStatus: executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING,
				Status:     executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, Result: out.Result,
			})
			e = resp.GetExecution()
			return err
		})
		if v != outcome.ResultRefused {
			return e, v, wrap(err, "settle attempt %d of %s", a.Attempt, a.ExecutionID)
		}
		// The adapter answered a result the platform cannot store: that is the adapter failing,
		// permanently — not a success to drop, and not the client's fault.
		log.Warn("adapter result refused; recorded as a protocol failure", zap.String("code", status.Code(err).String()))
		out = ResultRefusedFailure(refusalDescription(err))
	}
	if out.Kind == execution.OutcomeAccepted {
		out = execution.Outcome{Kind: execution.OutcomeFailed, Failure: execution.Failure{
			Class: execution.ClassProtocol, Message: "adapter answered Accepted (long-running work) for a sync execution"}}
	}
	var e *executionv1.Execution
	o.What = "fail_attempt"
	v, err := outcome.Do(ctx, o, func(ctx context.Context) error {
		resp, err := s.Client.FailAttempt(ctx, &settlementv1.FailAttemptRequest{
			ExecutionId: a.ExecutionID, Attempt: a.Attempt, Failure: out.Failure.Proto(),
			Retryable: out.Retryable, RetryAfter: durationpb.New(out.RetryAfter),
		})
		e = resp.GetExecution()
		return err
	})
	return e, v, wrap(err, "report failed attempt %d of %s", a.Attempt, a.ExecutionID)
}

// refusalDescription is what settlement said was wrong with the result, without its field names
// or reasons (DESIGN: a downstream status never reaches a client as it is): the description of
// its BadRequest violation, or a fixed text when it gave none.
func refusalDescription(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				if v.GetDescription() != "" {
					return v.GetDescription()
				}
			}
		}
	}
	return "the platform cannot store it"
}

// ResultRefusedFailure is the permanent protocol failure that replaces a result the platform
// refused. why is the refusal's message (the platform's own wording about the result).
func ResultRefusedFailure(why string) execution.Outcome {
	return adaptercall.InvalidResult(why)
}

func wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}
