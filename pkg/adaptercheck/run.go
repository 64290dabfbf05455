package adaptercheck

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// checker is one run of the check.
type checker struct {
	cfg      Config
	client   adapterv1.AdapterServiceClient
	signer   *platformtoken.Signer
	platform *platform
}

// Run checks the adapter cfg names against every rule and reports each verdict. Its error is for a
// check that could not run at all (a setting missing); an adapter that cannot be reached fails
// the rules instead.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Callbacks != nil {
		defer func() { _ = cfg.Callbacks.Close() }()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	conn, err := dial(cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	c := &checker{cfg: cfg, client: adapterv1.NewAdapterServiceClient(conn), signer: platformtoken.NewSigner(cfg.Key),
		platform: newPlatform(cfg.Credential, cfg.Lease, cfg.LeaseGrace)}
	if cfg.Callbacks != nil {
		srv := grpc.NewServer()
		adapterv1.RegisterAdapterCallbackServiceServer(srv, c.platform)
		go func() { _ = srv.Serve(cfg.Callbacks) }()
		defer srv.Stop()
	}

	report := &Report{}
	report.Results = append(report.Results, c.tokenRules(ctx)...)
	report.Results = append(report.Results, c.deadlineRules(ctx)...)
	report.Results = append(report.Results, c.longWorkRules(ctx)...)
	return report, nil
}

func dial(cfg Config) (*grpc.ClientConn, error) {
	opts := cfg.DialOptions
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(cfg.Addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("adapter address %s: %w", cfg.Addr, err)
	}
	return conn, nil
}

// WaitTrusted waits until the adapter accepts tokens signed with cfg.Key for cfg.AdapterID — for
// an author who starts the adapter with the public key the check just generated — by sending it
// Cancels of an execution it does not run (no work) until one is not refused for its key or
// audience. It returns the last refusal's check when ctx ends first.
func WaitTrusted(ctx context.Context, cfg Config) error {
	conn, err := dial(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	c := &checker{cfg: cfg.withDefaults(), client: adapterv1.NewAdapterServiceClient(conn), signer: platformtoken.NewSigner(cfg.Key)}
	var last string // every pass that does not return sets it before the wait reads it
	for {
		req := &adapterv1.CancelRequest{ExecutionId: uuid.NewString(), Attempt: 1}
		_, err := c.cancel(ctx, req)
		r := platformtoken.ReadRefusal(err, false)
		switch {
		case err == nil || status.Code(err) == codes.Unimplemented:
			return nil
		case r.Marked && (r.Check == platformtoken.CheckKey || r.Check == platformtoken.CheckAudience):
			last = fmt.Sprintf("the adapter refuses the token (check %q)", r.Check)
		case r.Marked:
			return nil // refused for another reason: the rules will say
		default:
			last = status.Convert(err).Message()
		}
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("the adapter at %s does not accept the check's key yet: %s", cfg.Addr, last)
		case <-t.C:
		}
	}
}

// answer is what an Execute call got back.
type answer struct {
	resp *adapterv1.ExecuteResponse
	err  error
	// received: the integrations-received response header came.
	received bool
	elapsed  time.Duration
}

// callbackToken is a new attempt's secret, in the platform's form.
func callbackToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "cbt_" + base64.RawURLEncoding.EncodeToString(b)
}

// request is a new attempt of a new execution, with deadline from now.
func request(capability string, payload *structpb.Struct, mode executionv1.Mode, deadline time.Duration) *adapterv1.ExecuteRequest {
	return &adapterv1.ExecuteRequest{
		ExecutionId: uuid.NewString(), Attempt: 1, Capability: capability, Payload: payload,
		DeadlineTime: timestamppb.New(time.Now().Add(deadline)), CallbackToken: callbackToken(), Mode: mode,
		DeadlineIn: durationpb.New(deadline),
	}
}

func (c *checker) syncRequest() *adapterv1.ExecuteRequest {
	return request(c.cfg.Capability, c.cfg.Payload, executionv1.Mode_MODE_SYNC, c.cfg.SyncTimeout)
}

// token signs a token for a call of method with req, by signer, addressed to audience, as if the
// clock read now.
func token(signer *platformtoken.Signer, audience, method string, req interface {
	proto.Message
	GetExecutionId() string
	GetAttempt() int32
}, deadline, now time.Time) string {
	tok, err := signer.SignAt(platformtoken.Call{AdapterID: audience, ExecutionID: req.GetExecutionId(), Attempt: req.GetAttempt(),
		Method: method, Deadline: deadline, Request: req}, now)
	if err != nil {
		// Only a request the digest cannot encode fails, and the check builds every request.
		panic(fmt.Sprintf("adapter check: sign: %v", err))
	}
	return tok
}

// signedExecute is a valid token for Execute of req with timeout, signed now.
func (c *checker) signedExecute(req *adapterv1.ExecuteRequest, timeout time.Duration) string {
	now := time.Now()
	return token(c.signer, c.cfg.AdapterID, adapterv1.AdapterService_Execute_FullMethodName, req, now.Add(timeout), now)
}

// execute calls Execute with req and tok ("" sends no token), within timeout.
func (c *checker) execute(ctx context.Context, req *adapterv1.ExecuteRequest, tok string, timeout time.Duration) answer {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if tok != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, platformtoken.Header, tok)
	}
	var header metadata.MD
	start := time.Now()
	resp, err := c.client.Execute(ctx, req, grpc.Header(&header))
	return answer{resp: resp, err: err, received: len(header.Get(platformtoken.ReceivedHeader)) > 0, elapsed: time.Since(start)}
}

// cancel calls Cancel for req with a valid token, within the sync timeout.
func (c *checker) cancel(ctx context.Context, req *adapterv1.CancelRequest) (*adapterv1.CancelResponse, error) {
	ctx, done := context.WithTimeout(ctx, c.cfg.SyncTimeout)
	defer done()
	now := time.Now()
	tok := token(c.signer, c.cfg.AdapterID, adapterv1.AdapterService_Cancel_FullMethodName, req, now.Add(c.cfg.SyncTimeout), now)
	return c.client.Cancel(metadata.AppendToOutgoingContext(ctx, platformtoken.Header, tok), req)
}

func outcomeName(resp *adapterv1.ExecuteResponse) string {
	switch resp.GetOutcome().(type) {
	case *adapterv1.ExecuteResponse_Completed:
		return "completed"
	case *adapterv1.ExecuteResponse_Failed:
		return "failed"
	case *adapterv1.ExecuteResponse_Accepted:
		return "accepted"
	}
	return "no outcome"
}

// describe says what an error answer was, in one line.
func describe(err error) string {
	st := status.Convert(err)
	return fmt.Sprintf("%s %q", st.Code(), st.Message())
}

// tokenRules sends the sync request with no token, a forged, an expired, a replayed, a
// misaddressed and a misbound one: each must be refused with the marker naming the check, and
// nothing run.
func (c *checker) tokenRules(ctx context.Context) []Result {
	method := adapterv1.AdapterService_Execute_FullMethodName
	timeout := c.cfg.SyncTimeout
	var out []Result

	req := c.syncRequest()
	out = append(out, judgeRefusal(RuleUnsigned, platformtoken.CheckMissing, c.execute(ctx, req, "", timeout)))

	req = c.syncRequest()
	_, stranger, err := platformtoken.Generate()
	if err != nil {
		out = append(out, fail(RuleForged, "generate a stranger's key: %v", err))
	} else {
		now := time.Now()
		tok := token(platformtoken.NewSigner(stranger), c.cfg.AdapterID, method, req, now.Add(timeout), now)
		out = append(out, judgeRefusal(RuleForged, platformtoken.CheckKey, c.execute(ctx, req, tok, timeout)))
	}

	// Signed ten minutes ago for its longest life (90 s): expired by any clock within minutes of ours.
	req = c.syncRequest()
	tok := token(c.signer, c.cfg.AdapterID, method, req, time.Time{}, time.Now().Add(-10*time.Minute))
	out = append(out, judgeRefusal(RuleExpired, platformtoken.CheckInvalid, c.execute(ctx, req, tok, timeout)))

	req = c.syncRequest()
	tok = c.signedExecute(req, timeout)
	if first := c.execute(ctx, req, tok, timeout); first.err != nil {
		out = append(out, fail(RuleReplayed, "the first presentation of a valid token was not answered: %s", describeRefusal(first)))
	} else {
		out = append(out, judgeRefusal(RuleReplayed, platformtoken.CheckReplayed, c.execute(ctx, req, tok, timeout)))
	}

	req = c.syncRequest()
	now := time.Now()
	tok = token(c.signer, c.cfg.AdapterID+".other", method, req, now.Add(timeout), now)
	out = append(out, judgeRefusal(RuleAudience, platformtoken.CheckAudience, c.execute(ctx, req, tok, timeout)))

	// Signed for this request; sent with another callback token, as a captured token would be
	// used to run other work under the same ids.
	req = c.syncRequest()
	tok = c.signedExecute(req, timeout)
	other := proto.CloneOf(req)
	other.CallbackToken = callbackToken()
	out = append(out, judgeRefusal(RuleBinding, platformtoken.CheckBinding, c.execute(ctx, other, tok, timeout)))
	return out
}

// judgeRefusal is the verdict on an answer that must be the refusal marker with check want.
func judgeRefusal(rule Rule, want string, a answer) Result {
	if a.err == nil {
		return fail(rule, "answered %s: the call ran without a valid token (§6: verify the token before anything of the call runs)",
			outcomeName(a.resp))
	}
	r := platformtoken.ReadRefusal(a.err, a.received)
	switch {
	case !r.Marked && r.Problem != "":
		return fail(rule, "malformed refusal marker (%s): %s (§8)", r.Problem, r.Detail)
	case !r.Marked:
		return fail(rule, "answered %s without the refusal marker: UNAUTHENTICATED with an ErrorInfo of domain %q, reason %q (§8)",
			describe(a.err), platformtoken.RefusalDomain, platformtoken.RefusalReason)
	case r.Problem != "":
		return fail(rule, "refusal marker with a bad check (%s): %s (§8)", r.Problem, r.Detail)
	case r.Check != want:
		return fail(rule, "refused with check %q, want %q (§6 orders the checks)", r.Check, want)
	}
	return pass(rule, "refused: UNAUTHENTICATED, marker check %q, before %s", want, platformtoken.ReceivedHeader)
}

// describeRefusal says why a valid call was not answered, with the likely fix for a refusal.
func describeRefusal(a answer) string {
	r := platformtoken.ReadRefusal(a.err, a.received)
	switch {
	case r.Marked && r.Check == platformtoken.CheckKey:
		return "refused, check \"key\": the adapter does not hold the check's public key (INTEGRATIONS_PLATFORM_PUBLIC_KEYS)"
	case r.Marked && r.Check == platformtoken.CheckAudience:
		return "refused, check \"audience\": the adapter's own id is not the --adapter-id given to the check"
	case r.Marked:
		return fmt.Sprintf("refused, check %q", r.Check)
	case status.Code(a.err) == codes.DeadlineExceeded:
		return fmt.Sprintf("no answer within the call's deadline (%s)", a.elapsed.Round(time.Millisecond))
	}
	return describe(a.err)
}

// deadlineRules sends a valid sync call: it must be answered with an outcome within its deadline,
// and should carry the received header.
func (c *checker) deadlineRules(ctx context.Context) []Result {
	req := c.syncRequest()
	a := c.execute(ctx, req, c.signedExecute(req, c.cfg.SyncTimeout), c.cfg.SyncTimeout)
	var deadline Result
	switch {
	case a.err != nil:
		deadline = fail(RuleDeadline, "a valid sync call was not answered: %s", describeRefusal(a))
	case a.resp.GetAccepted() != nil:
		deadline = fail(RuleDeadline, "answered accepted to a sync call: the platform cannot wait; answer completed or failed within the call (§3)")
	case a.resp.GetOutcome() == nil:
		deadline = fail(RuleDeadline, "answered no outcome, a protocol fault (§3)")
	default:
		deadline = pass(RuleDeadline, "answered %s in %s (deadline %s)", outcomeName(a.resp), a.elapsed.Round(10*time.Microsecond), c.cfg.SyncTimeout)
	}
	received := pass(RuleReceived, "sent with the answer")
	switch {
	case a.err != nil:
		received = skip(RuleReceived, "no answer to look at (see %s)", RuleDeadline)
	case !a.received:
		received = Result{Rule: RuleReceived, Verdict: Warn, Detail: "no " + platformtoken.ReceivedHeader +
			" response header: the platform cannot tell a call lost on a broken connection from one that ran, and spends the attempt (§2)"}
	}
	return []Result{deadline, received}
}

// longWorkRules runs the three scenarios of accepted work side by side.
func (c *checker) longWorkRules(ctx context.Context) []Result {
	if c.cfg.LongPayload == nil {
		why := "no long-work payload given (--long-payload): the adapter's Accepted work is not checked"
		return []Result{skip(RuleCancel, "%s", why), skip(RuleLease, "%s", why), skip(RuleComplete, "%s", why), skip(RuleLate, "%s", why)}
	}
	var wg sync.WaitGroup
	var cancel, lease, complete, late Result
	wg.Go(func() { cancel = c.cancelRule(ctx) })
	wg.Go(func() { lease, complete = c.leaseRules(ctx) })
	wg.Go(func() { late = c.lateRule(ctx) })
	wg.Wait()
	return []Result{cancel, lease, complete, late}
}

// start sends a valid async Execute of the long payload; the adapter must answer Accepted. The
// call's deadline is the lease or the execution's deadline, whichever ends first, as the
// platform's.
func (c *checker) start(ctx context.Context, loseAnswer bool) (*attempt, time.Time, error) {
	req := request(c.cfg.LongCapability, c.cfg.LongPayload, executionv1.Mode_MODE_ASYNC, c.cfg.Deadline)
	a := c.platform.register(req, time.Now().Add(c.cfg.Deadline), loseAnswer)
	timeout := min(c.cfg.Lease, c.cfg.Deadline)
	ans := c.execute(ctx, req, c.signedExecute(req, timeout), timeout)
	switch {
	case ans.err != nil:
		return nil, time.Time{}, fmt.Errorf("the long-work call was not answered: %s", describeRefusal(ans))
	case ans.resp.GetAccepted() == nil:
		return nil, time.Time{}, fmt.Errorf("the long-work call was answered %s, not accepted: give --long-payload work that the adapter accepts (async)",
			outcomeName(ans.resp))
	}
	return a, c.platform.accepted(a, ans.resp.GetAccepted().GetLease().AsDuration()), nil
}

// next waits for the attempt's next callback until until; false when none came.
func next(ctx context.Context, a *attempt, until time.Time) (event, bool) {
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	select {
	case ev := <-a.events:
		return ev, true
	case <-t.C:
	case <-ctx.Done():
	}
	return event{}, false
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// since is how long after t0 t was, for the report.
func since(t0, t time.Time) string { return "+" + t.Sub(t0).Round(10*time.Millisecond).String() }

// cancelRule: accepted work is cancelled; the adapter must answer stopped=true and stop — no
// successful Complete, and no renewals beyond one already in flight, until the lease in force
// when it was cancelled would have run out. (A successful Complete is refused, as the platform
// refuses it for a cancelled execution; renewals are granted, so that only the Cancel can have
// stopped the work.)
func (c *checker) cancelRule(ctx context.Context) Result {
	a, _, err := c.start(ctx, false)
	if err != nil {
		return skip(RuleCancel, "needs accepted work (see %s)", RuleLease)
	}
	resp, err := c.cancel(ctx, &adapterv1.CancelRequest{ExecutionId: a.id, Attempt: a.n})
	if err != nil {
		r := platformtoken.ReadRefusal(err, false)
		switch {
		case r.Marked:
			return fail(RuleCancel, "Cancel with a valid token was refused, check %q", r.Check)
		case status.Code(err) == codes.Unimplemented:
			return fail(RuleCancel, "Cancel answered UNIMPLEMENTED: the spec allows it, but then cancelled work runs on (§4)")
		}
		return fail(RuleCancel, "Cancel answered %s", describe(err))
	}
	cancelled := time.Now()
	if !resp.GetStopped() {
		return fail(RuleCancel, "Cancel answered stopped=false for work it had accepted: the running attempt was not found (§4)")
	}
	// From here its Complete is refused as the cancelled execution's, but renewals are still
	// granted: the work must stop on the Cancel alone, not on a refused renewal. Work still
	// running must renew or complete before its lease runs out: waiting that long shows whether
	// it stopped.
	c.platform.cancel(a)
	until := c.platform.leaseEnd(a).Add(c.cfg.LeaseGrace)
	renewals := 0
	for {
		ev, ok := next(ctx, a, until)
		if !ok {
			break
		}
		switch {
		case ev.method == methodComplete && ev.outcome == execution.AttemptSucceeded:
			return fail(RuleCancel, "the work completed (succeeded) %s after Cancel answered stopped=true: it was not stopped (§4)", since(cancelled, ev.at))
		case ev.method == methodRenew && ev.at.After(cancelled):
			if renewals++; renewals > 1 {
				return fail(RuleCancel, "the lease was renewed %d times after Cancel answered stopped=true: the work goes on (§4)", renewals)
			}
		}
	}
	if ctx.Err() != nil {
		return fail(RuleCancel, "interrupted: %v", ctx.Err())
	}
	return pass(RuleCancel, "answered stopped=true; no completion and no renewal beyond one in flight until the lease would have run out (%s)",
		until.Sub(cancelled).Round(10*time.Millisecond))
}

// leaseRules: accepted work must keep its lease alive — every renewal or its completion before
// the lease in force runs out (plus the grace) — and its Complete is accepted once; no second
// Complete may follow within a lease after it.
func (c *checker) leaseRules(ctx context.Context) (lease, complete Result) {
	a, firstEnd, err := c.start(ctx, false)
	if err != nil {
		return fail(RuleLease, "%s", err), skip(RuleComplete, "needs accepted work (see %s)", RuleLease)
	}
	started := time.Now()
	bound := a.deadline
	renewals := 0
	var latest time.Duration // the latest a renewal came after the lease it renewed had ended
	var completed event
	for completed.at.IsZero() {
		end := c.platform.leaseEnd(a)
		ev, ok := next(ctx, a, earliest(end.Add(c.cfg.LeaseGrace), bound))
		switch {
		case ctx.Err() != nil:
			return fail(RuleLease, "interrupted: %v", ctx.Err()), skip(RuleComplete, "interrupted")
		case !ok && c.platform.sweep(a):
			return fail(RuleLease, "the lease (%s, ending %s) ran out with no renewal or completion in the %s grace after it: %d renewals before (§5)",
					c.cfg.Lease, since(started, end), c.cfg.LeaseGrace, renewals),
				skip(RuleComplete, "the attempt ended with its lease (see %s)", RuleLease)
		case !ok && time.Now().After(bound):
			return fail(RuleLease, "no completion within the execution's deadline (%s)", c.cfg.Deadline), skip(RuleComplete, "no completion")
		case !ok:
			continue
		case ev.fault != "":
			return fail(RuleLease, "%s refused: %s (§5)", ev.method, ev.fault), skip(RuleComplete, "a callback was refused (see %s)", RuleLease)
		case ev.method == methodRenew && ev.answer == nil:
			renewals++
			latest = max(latest, ev.at.Sub(end))
		case ev.method == methodComplete && ev.answer == nil:
			completed = ev
		case ev.method == methodComplete:
			return fail(RuleLease, "Complete refused: %s", describe(ev.answer)), skip(RuleComplete, "the completion was refused (see %s)", RuleLease)
		}
	}
	switch {
	case !completed.at.After(firstEnd):
		lease = fail(RuleLease, "the work completed %s, within its first lease (%s): no renewal was needed, so none was shown; give --long-payload work that outlasts --lease",
			since(started, completed.at), c.cfg.Lease)
	case latest > 0:
		lease = pass(RuleLease, "renewed %d times; one renewal came %s after its lease ended, within the %s grace; completed %s",
			renewals, latest.Round(10*time.Millisecond), c.cfg.LeaseGrace, since(started, completed.at))
	default:
		lease = pass(RuleLease, "renewed %d times, each before the lease (%s) ran out; completed %s", renewals, c.cfg.Lease, since(started, completed.at))
	}

	// Nothing more may come: wait a lease, in which a renewal would come if the work went on.
	until := completed.at.Add(c.cfg.Lease + c.cfg.LeaseGrace)
	for {
		ev, ok := next(ctx, a, until)
		if !ok {
			break
		}
		if ev.method == methodComplete {
			return lease, fail(RuleComplete, "a second Complete came %s after the first was accepted (§5: an attempt ends once)", since(completed.at, ev.at))
		}
	}
	return lease, pass(RuleComplete, "one Complete (%s) accepted %s, answered status %s; no second one within %s",
		completed.outcome, since(started, completed.at), c.platform.status(a), until.Sub(completed.at).Round(10*time.Millisecond))
}

// lateRule: the first Complete of accepted work is applied and answered UNAVAILABLE, as an answer
// lost on the way looks to the adapter. The adapter must retry it (§5: until the lease ends, at
// least 10 s), and take the retry's ABORTED NO_LONGER_APPLICABLE as final: no third Complete.
func (c *checker) lateRule(ctx context.Context) Result {
	a, _, err := c.start(ctx, true)
	if err != nil {
		return skip(RuleLate, "needs accepted work (see %s)", RuleLease)
	}
	var first, second time.Time
	for bound := a.deadline; second.IsZero(); {
		if !first.IsZero() {
			bound = first.Add(c.cfg.Wait)
		}
		ev, ok := next(ctx, a, bound)
		switch {
		case ctx.Err() != nil:
			return fail(RuleLate, "interrupted: %v", ctx.Err())
		case !ok && first.IsZero():
			return skip(RuleLate, "no completion within the execution's deadline (see %s)", RuleLease)
		case !ok:
			return fail(RuleLate, "after its Complete was answered UNAVAILABLE the adapter did not retry within %s: the outcome is lost (§5: retry until the lease ends, and at least 10 s)",
				c.cfg.Wait)
		case ev.method != methodComplete:
		case first.IsZero() && status.Code(ev.answer) != codes.Unavailable:
			return skip(RuleLate, "the first Complete was answered %s (see %s)", describe(ev.answer), RuleLease)
		case first.IsZero():
			first = ev.at
		default:
			if st := status.Code(ev.answer); st != codes.Aborted {
				return fail(RuleLate, "the retried Complete was answered %s, not ABORTED NO_LONGER_APPLICABLE", describe(ev.answer))
			}
			second = ev.at
		}
	}
	until := second.Add(c.cfg.Lease + c.cfg.LeaseGrace)
	for {
		ev, ok := next(ctx, a, until)
		if !ok {
			break
		}
		if ev.method == methodComplete {
			return fail(RuleLate, "Complete sent again %s after ABORTED NO_LONGER_APPLICABLE: that refusal is final (§5: stop the work, send nothing more)",
				since(second, ev.at))
		}
	}
	return pass(RuleLate, "the first Complete was applied and answered UNAVAILABLE; the retry %s later was refused ABORTED NO_LONGER_APPLICABLE, and nothing followed it",
		second.Sub(first).Round(time.Millisecond))
}
