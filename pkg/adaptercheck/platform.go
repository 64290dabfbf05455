package adaptercheck

import (
	"context"
	"crypto/subtle"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// Callback methods, as events name them.
const (
	methodRenew    = "RenewLease"
	methodProgress = "ReportProgress"
	methodComplete = "Complete"
)

// event is one callback the adapter made for an attempt, and how the check answered it.
type event struct {
	method string
	at     time.Time
	// answer is the refusal the check answered (nil: taken).
	answer error
	// fault says what the adapter got wrong when the refusal is its fault (a wrong callback token,
	// no credential, a missing field); "" otherwise.
	fault string
	// outcome is a Complete's: execution.AttemptSucceeded or AttemptFailed ("" if none).
	outcome execution.AttemptOutcome
}

// attempt is one attempt the check started, as the callback service knows it.
type attempt struct {
	id    string
	n     int32
	token string
	// deadline is the execution's deadline; no lease runs past it.
	deadline time.Time
	// loseAnswer: the first Complete is applied but answered UNAVAILABLE, as the adapter sees an
	// answer lost on a broken connection (RuleLate).
	loseAnswer bool
	events     chan event

	// Guarded by platform.mu.
	leaseEnd time.Time
	// ended is the execution's status once the attempt is over (completed, cancelled, swept).
	ended     execution.Status
	completes int
	// cancelled: the execution was cancelled while the attempt ran (cancelRule).
	cancelled bool
}

// platform is the check's AdapterCallbackService: it answers as services/adapter-callback does,
// in the same order (credential, ids, attempt and token, still running, the message's fields),
// with the same codes and ErrorInfo reasons, and reports every callback to the attempt's
// scenario.
type platform struct {
	adapterv1.UnimplementedAdapterCallbackServiceServer
	credential string
	lease      time.Duration
	grace      time.Duration

	mu       sync.Mutex
	attempts map[string]*attempt
}

func newPlatform(credential string, lease, grace time.Duration) *platform {
	return &platform{credential: credential, lease: lease, grace: grace, attempts: map[string]*attempt{}}
}

// register makes an attempt known before its Execute goes out: an adapter may call back before
// the Execute's answer reaches the check. Its lease runs from now until the answer sets it.
func (p *platform) register(req *adapterv1.ExecuteRequest, deadline time.Time, loseAnswer bool) *attempt {
	a := &attempt{id: req.GetExecutionId(), n: req.GetAttempt(), token: req.GetCallbackToken(), deadline: deadline,
		loseAnswer: loseAnswer, events: make(chan event, 1024), leaseEnd: time.Now().Add(p.lease)}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts[a.id] = a
	return a
}

// grant is the lease the platform grants for asked: the capability's when asked is 0 or more,
// never past the deadline.
func (p *platform) grant(a *attempt, now time.Time, asked time.Duration) time.Duration {
	lease := asked
	if lease <= 0 || lease > p.lease {
		lease = p.lease
	}
	if left := a.deadline.Sub(now); lease > left {
		lease = max(left, 0)
	}
	return lease
}

// accepted sets the lease of an attempt the adapter answered Accepted, from now; a renewal that
// came before the answer and runs longer is kept.
func (p *platform) accepted(a *attempt, asked time.Duration) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if end := now.Add(p.grant(a, now, asked)); end.After(a.leaseEnd) {
		a.leaseEnd = end
	}
	return a.leaseEnd
}

// leaseEnd is when the attempt's lease ends.
func (p *platform) leaseEnd(a *attempt) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return a.leaseEnd
}

// status is the execution's status as the attempt left it ("running" while it runs).
func (p *platform) status(a *attempt) execution.Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a.ended == "" {
		return execution.StatusRunning
	}
	return a.ended
}

// cancel marks the attempt's execution cancelled: its Complete is refused NO_LONGER_APPLICABLE,
// as the platform's; its renewals and progress are still taken (see cancelRule).
func (p *platform) cancel(a *attempt) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a.cancelled = true
}

// sweepLocked ends an attempt whose lease ran out more than the grace ago, as the platform's
// sweeper does (a timeout failure, retried: the execution is pending again). It reports whether
// the attempt is over.
func (p *platform) sweepLocked(a *attempt, now time.Time) bool {
	if a.ended == "" && now.After(a.leaseEnd.Add(p.grace)) {
		a.ended = execution.StatusPending
	}
	return a.ended != ""
}

// sweep is sweepLocked for a scenario whose wait for a callback ran out.
func (p *platform) sweep(a *attempt) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sweepLocked(a, time.Now())
}

// refusal is an answer of the callback service's, and what the adapter got wrong if it is its fault.
type refusal struct {
	err   error
	fault string
}

func invalidCallback(msg string) *refusal {
	return &refusal{err: apperr.New(apperr.KindUnauthenticated, errorsv1.ErrorReason_INVALID_CALLBACK.String(), "%s", msg), fault: msg}
}

func invalidField(field, msg string) *refusal {
	return &refusal{err: apperr.Invalid(field, "%s", msg), fault: field + ": " + msg}
}

func notApplicable(a *attempt, why string) *refusal {
	return &refusal{err: apperr.New(apperr.KindAborted, errorsv1.ErrorReason_NO_LONGER_APPLICABLE.String(), "attempt %d is no longer applicable: %s", a.n, why).
		With("status", string(a.ended)).With("attempt", strconv.Itoa(int(a.n)))}
}

// authorizeLocked applies the refusals that come before the attempt's state, in the platform's
// order, and returns the attempt the call names (nil if none).
func (p *platform) authorizeLocked(ctx context.Context, id string, n int32, token string) (*attempt, *refusal) {
	a := p.attempts[id]
	cred, err := grpcx.BearerToken(ctx)
	switch {
	case err != nil:
		return a, invalidCallback("no adapter credential (authorization: Bearer <credential>)")
	case p.credential != "" && subtle.ConstantTimeCompare([]byte(cred), []byte(p.credential)) != 1:
		return a, invalidCallback("unknown adapter credential")
	}
	if _, err := uuid.Parse(id); err != nil {
		return a, invalidField("execution_id", "not a UUID")
	}
	if n < 1 {
		return a, invalidField("attempt", "must be at least 1")
	}
	if a == nil || a.n != n || subtle.ConstantTimeCompare([]byte(token), []byte(a.token)) != 1 {
		return a, invalidCallback("unknown execution, attempt or callback token")
	}
	return a, nil
}

// answer records the callback on its attempt and turns a refusal into the status the platform
// sends.
func (p *platform) answer(a *attempt, ev event, r *refusal) error {
	if r != nil {
		ev.answer, ev.fault = grpcx.ToStatus(r.err).Err(), r.fault
	}
	if a != nil {
		select {
		case a.events <- ev:
		default: // a flood of callbacks: the scenario has seen enough of them
		}
	}
	return ev.answer
}

// RenewLease implements AdapterCallbackService.RenewLease.
func (p *platform) RenewLease(ctx context.Context, req *adapterv1.RenewLeaseRequest) (*adapterv1.RenewLeaseResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	ev := event{method: methodRenew, at: now}
	a, r := p.authorizeLocked(ctx, req.GetExecutionId(), req.GetAttempt(), req.GetCallbackToken())
	if r != nil {
		return nil, p.answer(a, ev, r)
	}
	if p.sweepLocked(a, now) {
		return nil, p.answer(a, ev, notApplicable(a, "it is no longer running"))
	}
	if req.GetLease().AsDuration() < 0 {
		return nil, p.answer(a, ev, invalidField("lease", "must not be negative"))
	}
	lease := p.grant(a, now, req.GetLease().AsDuration())
	a.leaseEnd = now.Add(lease)
	return &adapterv1.RenewLeaseResponse{LeaseExpireTime: timestamppb.New(a.leaseEnd), Lease: durationpb.New(lease)}, p.answer(a, ev, nil)
}

// ReportProgress implements AdapterCallbackService.ReportProgress.
func (p *platform) ReportProgress(ctx context.Context, req *adapterv1.ReportProgressRequest) (*adapterv1.ReportProgressResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	ev := event{method: methodProgress, at: now}
	a, r := p.authorizeLocked(ctx, req.GetExecutionId(), req.GetAttempt(), req.GetCallbackToken())
	if r != nil {
		return nil, p.answer(a, ev, r)
	}
	if p.sweepLocked(a, now) {
		return nil, p.answer(a, ev, notApplicable(a, "it is no longer running"))
	}
	if req.GetProgress() == nil {
		return nil, p.answer(a, ev, invalidField("progress", "required: a JSON object"))
	}
	return &adapterv1.ReportProgressResponse{}, p.answer(a, ev, nil)
}

// Complete implements AdapterCallbackService.Complete: the first outcome of a running attempt is
// applied, any later one refused as late.
func (p *platform) Complete(ctx context.Context, req *adapterv1.CompleteRequest) (*adapterv1.CompleteResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	ev := event{method: methodComplete, at: now}
	a, r := p.authorizeLocked(ctx, req.GetExecutionId(), req.GetAttempt(), req.GetCallbackToken())
	if r != nil {
		return nil, p.answer(a, ev, r)
	}
	status := execution.StatusFailed
	switch o := req.GetOutcome().(type) {
	case *adapterv1.CompleteRequest_Succeeded:
		ev.outcome, status = execution.AttemptSucceeded, execution.StatusSucceeded
	case *adapterv1.CompleteRequest_Failed:
		ev.outcome = execution.AttemptFailed
		if o.Failed.GetRetryable() {
			status = execution.StatusPending // the next attempt is scheduled
		}
	default:
		return nil, p.answer(a, ev, invalidField("outcome", "required: succeeded or failed"))
	}
	if a.cancelled && a.ended == "" {
		a.ended = execution.StatusCancelled
	}
	if p.sweepLocked(a, now) {
		return nil, p.answer(a, ev, notApplicable(a, "the attempt has ended"))
	}
	a.ended = status
	a.completes++
	if a.loseAnswer && a.completes == 1 {
		// Applied, and answered as an outage: to the adapter, an answer lost on the way.
		return nil, p.answer(a, ev, &refusal{err: apperr.New(apperr.KindUnavailable, errorsv1.ErrorReason_UNAVAILABLE.String(), "settlement unavailable, retry")})
	}
	return &adapterv1.CompleteResponse{Status: execution.StatusToProto(status)}, p.answer(a, ev, nil)
}
