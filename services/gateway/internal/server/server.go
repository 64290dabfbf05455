// Package server implements GatewayService: validation, authentication, accepting executions
// durably (async) or running their one attempt inline (sync), and reading them back.
package server

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/jsonbound"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/nudge"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/settle"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/sdk/go/outcome"
	"github.com/integrations-platform/integrations/services/gateway/internal/audit"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// HTTPCodeHeader is the response metadata key through which a handler asks grpc-gateway for an
// HTTP status other than 200 (202 for an accepted async execution).
const HTTPCodeHeader = "x-http-code"

// IdempotencyKeyHeader is the metadata key of the Idempotency-Key header.
const IdempotencyKeyHeader = "idempotency-key"

// List pages: at most MaxPageSize items, DefaultPageSize when the caller names none. Items leave
// out payloads, results and progress (each up to a MiB; GET one execution for them), so a page is
// bounded by its item count: a few hundred bytes each.
const (
	MaxPageSize     = 100
	DefaultPageSize = 50
)

// listItem is an execution as a list shows it: without payload, result or progress.
func listItem(r *execution.Row) (*executionv1.Execution, error) {
	e, err := r.Proto(false)
	if err != nil {
		return nil, err
	}
	e.Result, e.Progress = nil, nil
	return e, nil
}

var capabilityPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,127}$`)

// applicationPattern is an application id's form (the catalog's and the key endpoints').
var applicationPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// IdempotencyKeyMax bounds an idempotency key, in bytes.
const IdempotencyKeyMax = 255

// ValidIdempotencyKey reports whether k is a well-formed idempotency key: at most
// IdempotencyKeyMax printable ASCII characters without spaces ("" is no key). The REST guard
// checks the header with it, so that it is refused naming the header rather than the field.
func ValidIdempotencyKey(k string) bool {
	return len(k) <= IdempotencyKeyMax && !strings.ContainsFunc(k, func(r rune) bool { return r < 0x21 || r > 0x7e })
}

// Options configures a Server.
type Options struct {
	MaxPayloadBytes     int
	Scale               func(time.Duration) time.Duration
	WebhookAllowHTTP    bool
	WebhookAllowPrivate bool
	// WebhookDeny lists ranges never reached, whatever WebhookAllowPrivate says
	// (INTEGRATIONS_WEBHOOK_DENY_CIDRS).
	WebhookDeny []netip.Prefix
	// Resolver resolves consumer host names at registration, a courtesy check (nil: none).
	Resolver webhook.Resolver
	// SecretRotationOverlap is how long a replaced signing secret keeps signing deliveries beside
	// the new one (zero: not at all).
	SecretRotationOverlap time.Duration
}

// Server is the GatewayService.
type Server struct {
	gatewayv1.UnimplementedGatewayServiceServer
	store      *store.Store
	adapters   *adaptercall.Pool
	nudge      func()
	settlement settlementv1.SettlementServiceClient
	box        *secret.Box
	opts       Options
	log        *zap.Logger
	// syncMu orders syncClosing against syncs.Add: once StopSync set syncClosing, no sync call
	// joins syncs, so that WaitSync's Wait never races an Add.
	syncMu      sync.Mutex
	syncClosing bool
	// syncs counts sync calls from before their adapter call until their outcome is reported
	// (the report goes on in the background after the caller got its answer).
	syncs sync.WaitGroup
}

// errSyncStopping answers a sync call that arrives once the gateway stopped taking them.
func errSyncStopping() error {
	return apperr.New(apperr.KindUnavailable, errorsv1.ErrorReason_SHUTTING_DOWN.String(),
		"this gateway replica is shutting down and takes no new sync calls; retry, another replica answers")
}

// syncBegin counts a sync call in, unless StopSync was called.
func (s *Server) syncBegin() bool {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.syncClosing {
		return false
	}
	s.syncs.Add(1)
	return true
}

// StopSync makes the gateway refuse new sync calls with a retryable UNAVAILABLE (SHUTTING_DOWN):
// shutdown calls it once the drain window is over, before it waits for the calls in flight.
func (s *Server) StopSync() {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.syncClosing = true
}

// WaitSync stops taking sync calls and waits until every sync call in flight has answered and its
// outcome has been recorded or given up (each is bounded by its deadline plus syncReportGrace),
// or until ctx ends. Shutdown calls it before the settlement connection closes.
func (s *Server) WaitSync(ctx context.Context) error {
	s.StopSync()
	done := make(chan struct{})
	go func() { s.syncs.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sync calls and outcome reports still in flight: %w", ctx.Err())
	}
}

// New returns a Server.
func New(st *store.Store, adapters *adaptercall.Pool, dispatcher dispatcherv1.DispatcherServiceClient,
	settlement settlementv1.SettlementServiceClient, box *secret.Box, opts Options, log *zap.Logger) *Server {
	return &Server{store: st, adapters: adapters, nudge: nudge.Dispatcher(dispatcher, log), settlement: settlement, box: box, opts: opts, log: log}
}

// InvokeCapability implements GatewayService.InvokeCapability.
func (s *Server) InvokeCapability(ctx context.Context, req *gatewayv1.InvokeCapabilityRequest) (*gatewayv1.InvokeCapabilityResponse, error) {
	start := time.Now()
	resp, err := s.invokeCapability(ctx, req)
	acceptSeconds.WithLabelValues(modeLabel(req.GetMode()), outcomeLabel(err)).Observe(time.Since(start).Seconds())
	return resp, err
}

func (s *Server) invokeCapability(ctx context.Context, req *gatewayv1.InvokeCapabilityRequest) (*gatewayv1.InvokeCapabilityResponse, error) {
	appID := applicationID(ctx)
	in, err := s.validateInvoke(ctx, req)
	if err != nil {
		return nil, err
	}
	capability, err := s.store.CapabilityGet(ctx, req.GetCapability())
	if errors.Is(err, store.ErrNotFound) {
		return nil, apperr.NotFound("capability %q not found", req.GetCapability())
	}
	if err != nil {
		return nil, err
	}
	if !capability.AllowsMode(in.mode) {
		return nil, apperr.Invalid("mode", "capability %q does not allow %s", capability.Name, req.GetMode())
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("execution id: %w", err)
	}
	n := store.NewExecution{
		ID: id.String(), ApplicationID: appID, Capability: capability.Name, Mode: in.mode,
		MaxAttempts: capability.MaxAttempts, Payload: in.payload, RequestHash: in.hash,
		IdempotencyKey: in.idempotencyKey,
		Budget:         s.opts.Scale(capability.AsyncBudget),
	}
	// The execution's trace is the accept's: the call's span (or, tracing off here, the caller's
	// traceparent), stored on the row for the hops that follow through tables and queues.
	n.Traceparent, n.Tracestate = telemetry.Traceparent(ctx)
	telemetry.Annotate(ctx, telemetry.ExecutionID(n.ID))
	if in.mode == execution.ModeSync {
		return s.invokeSync(ctx, n, capability, req.GetPayload())
	}
	row, created, err := s.store.ExecutionAccept(ctx, n)
	if err != nil {
		return nil, acceptError(err)
	}
	if !created {
		// A replay answers the execution its idempotency key names, not the id made above.
		telemetry.Annotate(ctx, telemetry.ExecutionID(row.ID))
	}
	if created {
		s.log.Info("execution accepted", log.ExecutionID(row.ID), zap.String("capability", row.Capability), log.ApplicationID(appID))
		s.nudge()
		_ = grpc.SetHeader(ctx, metadata.Pairs(HTTPCodeHeader, "202"))
	}
	return s.response(row, nil)
}

// invokeSync runs attempt 1 inline and settles it through the settlement service. A sync call is
// never retried by the queue: a failure settles the execution failed — except when the adapter
// could not be reached at all (withdrawSync).
func (s *Server) invokeSync(ctx context.Context, n store.NewExecution, c *store.Capability, payload *structpb.Struct) (_ *gatewayv1.InvokeCapabilityResponse, err error) {
	// Counted from before the execution is written until its outcome is reported, so that a
	// shutdown waits for the call and its report before the settlement connection closes.
	if !s.syncBegin() {
		return nil, errSyncStopping()
	}
	reporting := false
	defer func() {
		if !reporting {
			s.syncs.Done()
		}
	}()
	token, tokenHash, err := secret.NewToken("cbt_")
	if err != nil {
		return nil, err
	}
	n.MaxAttempts = 1
	n.CallbackTokenHash = tokenHash
	n.Budget = c.SyncTimeout
	// The database sets the deadline (and the lease, the same) at its now() + SyncTimeout, no
	// earlier than this: the call below, bounded by SyncTimeout from here on this host's monotonic
	// clock, ends by the deadline the sweeper goes by whatever the clocks say.
	callDeadline := time.Now().Add(c.SyncTimeout)
	row, created, err := s.store.ExecutionAccept(ctx, n)
	if err != nil {
		return nil, acceptError(err)
	}
	if !created {
		// A replay answers the execution its idempotency key names, not the id made for the call.
		telemetry.Annotate(ctx, telemetry.ExecutionID(row.ID))
		return s.response(row, nil)
	}
	s.log.Info("sync attempt started", log.ExecutionID(row.ID), log.Attempt(1), zap.String("capability", row.Capability), log.ApplicationID(n.ApplicationID))

	// The attempt runs to its own deadline even if the caller goes away: the adapter may be doing
	// the work, and the outcome must be settled either way.
	callCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), callDeadline)
	defer cancel()
	out := s.adapters.Execute(callCtx, adaptercall.Adapter{ID: c.AdapterID, Endpoint: c.AdapterEndpoint}, &adapterv1.ExecuteRequest{
		ExecutionId: row.ID, Attempt: 1, Capability: row.Capability, Payload: payload,
		DeadlineTime: timestamppb.New(row.DeadlineAt), DeadlineIn: durationpb.New(time.Until(callDeadline)),
		CallbackToken: token, Mode: executionv1.Mode_MODE_SYNC,
	})
	switch {
	case out.Refused:
		// A configuration fault (signing key, public keys or adapter id disagree), not an outage.
		s.log.Error("adapter refused the platform's token", log.ExecutionID(row.ID),
			zap.String("adapter_id", c.AdapterID), zap.Error(out.Cause))
	case out.Replayed:
		// Not a configuration fault: this call's token was used by someone before it arrived.
		s.log.Error("possible attack: the adapter saw this call's platform token used before; attempt spent",
			log.ExecutionID(row.ID), zap.String("adapter_id", c.AdapterID), zap.Error(out.Cause))
	}
	if out.MalformedRefusal != "" {
		// The adapter meant to refuse the platform's token and got the marker wrong: its author must
		// hear of it (docs/adapter-protocol.md, "The refusal marker").
		s.log.Warn("adapter answered a malformed token-refusal marker", log.ExecutionID(row.ID),
			zap.String("adapter_id", c.AdapterID), zap.String("problem", out.MalformedRefusal), zap.Bool("attempt_spent", !out.NotSent))
	}
	if out.Kind == execution.OutcomeFailed && out.NotSent {
		if resp, done, err := s.withdrawSync(ctx, row); done {
			return resp, err
		}
	}
	reporting = true // reportSync's report counts the call out
	return s.reportSync(ctx, row, callDeadline, out)
}

// withdrawTimeout bounds the statement that takes back a sync accept.
const withdrawTimeout = 5 * time.Second

// withdrawSync answers a sync call whose adapter could not be reached, provably before any of the
// request went out (adaptercall's NotSent): no provider work can have started, so the client's one
// attempt is not spent. The accept is taken back (the execution and its attempt row deleted while
// still running at attempt 1) and the caller gets a retryable UNAVAILABLE; its retry with the
// same Idempotency-Key then finds nothing and starts afresh. A cancellation or the sweeper that
// settled the execution first keeps its outcome, and the caller gets the execution as it was
// settled. done=false (the statement failed, so whether the execution is still there is not
// known) leaves the outcome to the reporter, as for a call whose request went out.
func (s *Server) withdrawSync(ctx context.Context, row *execution.Row) (_ *gatewayv1.InvokeCapabilityResponse, done bool, _ error) {
	logger := s.log.With(log.ExecutionID(row.ID), log.Attempt(1), zap.String("capability", row.Capability))
	// Not the caller's context: a caller that went away must not leave the attempt spent.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	withdrawn, err := s.store.SyncWithdraw(wctx, row.ID)
	if err != nil {
		logger.Warn("sync accept not withdrawn after the adapter was unreachable; settling the attempt failed", zap.Error(err))
		return nil, false, nil
	}
	if !withdrawn {
		logger.Info("sync execution settled by another before its accept was withdrawn")
		resp, err := s.settledAnswer(wctx, row, nil)
		if err != nil {
			return nil, true, fmt.Errorf("read sync execution %s settled by another: %w", row.ID, err)
		}
		return resp, true, nil
	}
	logger.Warn("sync accept withdrawn: the adapter was unreachable and nothing was sent; no attempt spent")
	return nil, true, adapterUnavailable()
}

// adapterUnavailable is the answer to a sync call whose adapter could not be reached: retryable,
// and nothing of the call was kept.
func adapterUnavailable() error {
	return apperr.New(apperr.KindUnavailable, errorsv1.ErrorReason_ADAPTER_UNAVAILABLE.String(),
		"the capability's adapter could not be reached and nothing was sent to it; the execution was not kept, retry with the same Idempotency-Key")
}

// syncReportGrace is how long after a sync execution's deadline its outcome is still reported in
// the background: the settlement sweeper ends a running attempt only its grace (5 s by default)
// after the deadline, and an outcome that lands before then is taken.
const syncReportGrace = 5 * time.Second

// syncAnswerFloor is the least time the caller waits for the outcome to be recorded once the
// adapter answered, when the adapter answered at (or past) the deadline.
const syncAnswerFloor = 2 * time.Second

// reportSync hands the sync attempt's outcome to the settlement service through the one outcome
// reporter (sdk/go/outcome), as the consumer and the adapter SDK do: retried while settlement is
// unreachable or failing, a refused result recorded as the adapter's protocol failure (never an
// error about a field the caller did not send), and an execution settled meanwhile by another
// (a cancellation, the sweeper) answered as it was settled.
//
// The report runs in the background, to the deadline plus syncReportGrace, whatever happens to
// the call (it counts the sync call out of s.syncs when it ends): the caller waits for it until the deadline (at least syncAnswerFloor), and if the
// outcome is not recorded by then gets a retryable UNAVAILABLE while the report goes on — the
// execution still ends settled with the adapter's outcome, and reading it (or retrying the call
// with its idempotency key) shows it.
//
// deadline is the sync deadline on this host's monotonic clock, no later than the database's.
func (s *Server) reportSync(ctx context.Context, row *execution.Row, deadline time.Time, out execution.Outcome) (*gatewayv1.InvokeCapabilityResponse, error) {
	type reported struct {
		e   *executionv1.Execution
		v   outcome.Verdict
		err error
	}
	logger := s.log.With(log.ExecutionID(row.ID), log.Attempt(1))
	done := make(chan reported, 1)
	go func() {
		defer s.syncs.Done()
		rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(syncReportGrace))
		defer cancel()
		e, v, err := settle.Settler{Client: s.settlement, Log: logger}.Report(rctx,
			settle.Attempt{ExecutionID: row.ID, Attempt: 1, Until: deadline.Add(syncReportGrace)}, out)
		switch v {
		case outcome.Recorded, outcome.MovedOn:
		default:
			logger.Error("sync outcome not recorded; the sweeper ends the attempt", zap.Stringer("verdict", v), zap.Error(err))
		}
		done <- reported{e, v, err}
	}()
	wait := time.Until(deadline)
	if wait < syncAnswerFloor {
		wait = syncAnswerFloor
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	var r reported
	select {
	case r = <-done:
	case <-t.C:
		logger.Warn("sync outcome not recorded by the deadline; still reporting it in the background")
		return nil, outcomePending(row.ID)
	case <-ctx.Done():
		// The caller went away; the report goes on.
		return nil, ctx.Err()
	}
	switch r.v {
	case outcome.Recorded:
		return s.settledAnswer(context.WithoutCancel(ctx), row, r.e)
	case outcome.MovedOn:
		// Someone settled it meanwhile: the application cancelled it, or the sweeper found its
		// deadline passed. The caller gets the execution as it was settled.
		logger.Info("sync execution settled by another")
		return s.settledAnswer(context.WithoutCancel(ctx), row, nil)
	case outcome.Expired:
		return nil, outcomePending(row.ID)
	}
	return nil, syncSettleError(ctx, row.ID, r.err)
}

// outcomePending is the answer to a sync call whose attempt ended but whose outcome the settlement
// service has not recorded yet: retryable, and where to read the outcome.
func outcomePending(id string) error {
	return apperr.New(apperr.KindUnavailable, errorsv1.ErrorReason_OUTCOME_PENDING.String(),
		"the attempt ended but its outcome is not recorded yet; read it at /v1/executions/%s or retry with the same Idempotency-Key", id).
		With("execution_id", id)
}

// syncSettleError answers a sync call whose outcome settlement refused for a reason retrying
// cannot change (the reporter handled outages, a refused result and a settlement by another), in
// the gateway's own words: settlement's text, fields and reasons are for the logs.
func syncSettleError(ctx context.Context, id string, err error) error {
	return fmt.Errorf("settle sync execution %s: %w", id, grpcx.Downstream(ctx, "settlement", err))
}

// settledAnswer is the answer to a sync call whose execution is settled: the execution as an
// answer carries it (no payload), with its attempts as GetExecution shows them. settled is the
// settlement service's echo of the settlement this call recorded (it has no attempts); nil when
// another settled it, and the execution is read as it is then.
//
// The execution is settled whatever this read does: with the echo in hand, a failed or slow read
// of the attempts (bounded by settledReadTimeout) answers the echo without them rather than an
// error, which would tell the caller to retry work that is done.
func (s *Server) settledAnswer(ctx context.Context, row *execution.Row, settled *executionv1.Execution) (*gatewayv1.InvokeCapabilityResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, settledReadTimeout)
	defer cancel()
	if settled == nil {
		got, attempts, err := s.store.ExecutionGet(ctx, row.ApplicationID, row.ID)
		if err != nil {
			return nil, err
		}
		e, err := executionWithAttempts(got, false, attempts)
		if err != nil {
			return nil, err
		}
		return s.response(nil, e)
	}
	attempts, err := s.store.Attempts(ctx, row.ID)
	if err != nil {
		s.log.Warn("sync answer without its attempts: reading them failed", log.ExecutionID(row.ID), zap.Error(err))
		return s.response(nil, settled)
	}
	settled.Attempts = settled.Attempts[:0]
	for _, a := range attempts {
		settled.Attempts = append(settled.Attempts, a.Proto())
	}
	return s.response(nil, settled)
}

// settledReadTimeout bounds the read of a settled sync execution's attempts.
const settledReadTimeout = 5 * time.Second

// executionWithAttempts is an execution (with its payload, result and progress when withPayload)
// and its attempts, as GetExecution answers it.
func executionWithAttempts(row *execution.Row, withPayload bool, attempts []execution.AttemptRow) (*executionv1.Execution, error) {
	e, err := row.Proto(withPayload)
	if err != nil {
		return nil, err
	}
	for _, a := range attempts {
		e.Attempts = append(e.Attempts, a.Proto())
	}
	return e, nil
}

func (s *Server) response(row *execution.Row, e *executionv1.Execution) (*gatewayv1.InvokeCapabilityResponse, error) {
	if e == nil {
		var err error
		if e, err = row.Proto(false); err != nil {
			return nil, err
		}
	}
	return &gatewayv1.InvokeCapabilityResponse{Execution: e, Url: "/v1/executions/" + e.GetId()}, nil
}

func acceptError(err error) error {
	if errors.Is(err, store.ErrIdempotencyReused) {
		return apperr.New(apperr.KindAlreadyExists, errorsv1.ErrorReason_IDEMPOTENCY_KEY_REUSED.String(),
			"idempotency key already used for a different request")
	}
	return err
}

type invokeInput struct {
	mode           string
	payload        []byte
	hash           []byte
	idempotencyKey string
}

func (s *Server) validateInvoke(ctx context.Context, req *gatewayv1.InvokeCapabilityRequest) (*invokeInput, error) {
	if !capabilityPattern.MatchString(req.GetCapability()) {
		return nil, apperr.Invalid("capability", "%s is not a capability name", jsonbound.Quote(req.GetCapability()))
	}
	in := &invokeInput{}
	switch req.GetMode() {
	case executionv1.Mode_MODE_ASYNC:
		in.mode = execution.ModeAsync
	case executionv1.Mode_MODE_SYNC:
		in.mode = execution.ModeSync
	default:
		return nil, apperr.Invalid("mode", "required: MODE_ASYNC or MODE_SYNC")
	}
	payload := req.GetPayload()
	if payload == nil {
		payload = &structpb.Struct{}
	}
	// Before encoding: a payload Postgres cannot store, or one nested so deep that reading the
	// execution back would fail, is the caller's error, named as such.
	if err := jsonbound.Struct("payload", payload); err != nil {
		return nil, err
	}
	// encoding/json sorts map keys, which makes the encoding canonical for the request hash.
	raw, err := json.Marshal(payload.AsMap())
	if err != nil {
		return nil, apperr.Invalid("payload", "not encodable as JSON: %v", err)
	}
	if len(raw) > s.opts.MaxPayloadBytes {
		return nil, apperr.Invalid("payload", "%d bytes exceeds the limit of %d bytes", len(raw), s.opts.MaxPayloadBytes)
	}
	in.payload = raw
	in.idempotencyKey = req.GetIdempotencyKey()
	if md, ok := metadata.FromIncomingContext(ctx); ok && in.idempotencyKey == "" {
		v := md.Get(IdempotencyKeyHeader)
		if len(v) > 1 {
			// Two keys would be one chosen by chance (gRPC keeps both; REST headers map order).
			return nil, apperr.Invalid("idempotency_key", "given %d times in metadata; give it once", len(v))
		}
		if len(v) == 1 {
			if strings.TrimSpace(v[0]) == "" {
				// An empty key would be no key: the caller's retry would run the work again.
				return nil, apperr.Invalid("idempotency_key", "is empty in metadata: give a key, or leave it out")
			}
			in.idempotencyKey = v[0]
		}
	}
	if !ValidIdempotencyKey(in.idempotencyKey) {
		return nil, apperr.Invalid("idempotency_key", "must be at most %d printable ASCII characters without spaces", IdempotencyKeyMax)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", req.GetCapability(), in.mode)
	h.Write(raw)
	in.hash = h.Sum(nil)
	return in, nil
}

// GetExecution implements GatewayService.GetExecution.
func (s *Server) GetExecution(ctx context.Context, req *gatewayv1.GetExecutionRequest) (*gatewayv1.GetExecutionResponse, error) {
	if _, err := uuid.Parse(req.GetId()); err != nil {
		return nil, apperr.Invalid("id", "%s is not an execution id", jsonbound.Quote(req.GetId()))
	}
	app, err := callerScope(ctx)
	if err != nil {
		return nil, err
	}
	row, attempts, err := s.store.ExecutionGet(ctx, app, req.GetId())
	if errors.Is(err, store.ErrNotFound) {
		return nil, apperr.NotFound("execution %s not found", req.GetId())
	}
	if err != nil {
		return nil, err
	}
	e, err := executionWithAttempts(row, true, attempts)
	if err != nil {
		return nil, err
	}
	return &gatewayv1.GetExecutionResponse{Execution: e}, nil
}

// alreadySettled is the gateway's ALREADY_SETTLED made from the settlement service's: only the
// execution's status and attempt are carried over, and only when they are what they should be.
func alreadySettled(err error) error {
	md := rpcstatus.ErrorInfo(err).GetMetadata()
	st := execution.Status(md["status"])
	if !st.IsFinal() {
		return apperr.New(apperr.KindFailedPrecondition, errorsv1.ErrorReason_ALREADY_SETTLED.String(), "execution already settled").Wrap(err)
	}
	e := apperr.New(apperr.KindFailedPrecondition, errorsv1.ErrorReason_ALREADY_SETTLED.String(), "execution already settled %s", st).With("status", string(st))
	if n, perr := strconv.Atoi(md["attempt"]); perr == nil && n >= 0 {
		e = e.With("attempt", strconv.Itoa(n))
	}
	return e.Wrap(err)
}

// cancelTries bounds how often a cancellation reads the execution again because it moved between
// the read and the settlement (an attempt started, or a failed one sent it back to pending).
const cancelTries = 5

// adapterCancelTimeout bounds the best-effort request to the adapter to stop a cancelled attempt.
const adapterCancelTimeout = 2 * time.Second

// CancelExecution implements GatewayService.CancelExecution: the settlement service settles the
// execution CANCELLED from the status and attempt read here, with the same compare-and-set as any
// other settlement, so a cancellation racing a completion writes once. A pending execution's
// queued dispatch then finds it settled and does nothing; a running one's adapter is asked to stop.
func (s *Server) CancelExecution(ctx context.Context, req *gatewayv1.CancelExecutionRequest) (*gatewayv1.CancelExecutionResponse, error) {
	if _, err := uuid.Parse(req.GetId()); err != nil {
		return nil, apperr.Invalid("id", "%s is not an execution id", jsonbound.Quote(req.GetId()))
	}
	appID, err := callerScope(ctx)
	if err != nil {
		return nil, err
	}
	by := "the application"
	if isOperator(ctx) {
		by = "the operator"
	}
	for try := 1; ; try++ {
		row, _, err := s.store.ExecutionGet(ctx, appID, req.GetId())
		if errors.Is(err, store.ErrNotFound) {
			return nil, apperr.NotFound("execution %s not found", req.GetId())
		}
		if err != nil {
			return nil, err
		}
		if row.Status.IsFinal() {
			return nil, apperr.New(apperr.KindFailedPrecondition, errorsv1.ErrorReason_ALREADY_SETTLED.String(), "execution already settled %s", row.Status).
				With("status", string(row.Status)).With("attempt", strconv.Itoa(int(row.Attempt)))
		}
		settled, err := s.settlement.Settle(ctx, &settlementv1.SettleRequest{
			ExecutionId: row.ID, Attempt: row.Attempt, FromStatus: execution.StatusToProto(row.Status),
			Status:  executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED,
			Failure: execution.Failure{Reason: execution.ReasonCancelled, Message: "cancelled by " + by}.Proto(),
		})
		reason := rpcstatus.ErrorReason(err)
		moving := reason == errorsv1.ErrorReason_STALE_ATTEMPT || reason == errorsv1.ErrorReason_STATUS_MISMATCH
		switch {
		case err == nil:
		case moving && try < cancelTries:
			continue
		case reason == errorsv1.ErrorReason_ALREADY_SETTLED:
			// A completion won the race: the same answer as for an execution found settled.
			return nil, alreadySettled(err)
		case moving:
			return nil, apperr.New(apperr.KindAborted, errorsv1.ErrorReason_EXECUTION_BUSY.String(),
				"the execution kept changing while it was being cancelled; retry").Wrap(err)
		default:
			return nil, grpcx.Downstream(ctx, "settlement", err)
		}
		s.log.Info("execution cancelled", log.ExecutionID(row.ID), log.Attempt(row.Attempt),
			zap.String("from_status", string(row.Status)), log.ApplicationID(appID), log.EventID(settled.GetEventId()))
		// The settlement is another service's transaction: the entry is written after it.
		audit.Write(ctx, s.store, s.log, auditEntry(ctx, "execution.cancel", row.ID, map[string]any{
			"application_id": row.ApplicationID, "attempt": row.Attempt, "from_status": row.Status}))
		if row.Status == execution.StatusRunning {
			s.stopAttempt(ctx, row)
		}
		return &gatewayv1.CancelExecutionResponse{Execution: settled.GetExecution()}, nil
	}
}

// stopAttempt asks the adapter to stop a cancelled execution's running attempt. Best effort: the
// execution is settled already, and an outcome the adapter still sends is refused.
func (s *Server) stopAttempt(ctx context.Context, row *execution.Row) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adapterCancelTimeout)
	defer cancel()
	fields := []zap.Field{log.ExecutionID(row.ID), log.Attempt(row.Attempt)}
	c, err := s.store.CapabilityGet(ctx, row.Capability)
	if err != nil {
		s.log.Info("adapter not asked to stop the cancelled attempt", append(fields, zap.Error(err))...)
		return
	}
	stopped, err := s.adapters.Cancel(ctx, adaptercall.Adapter{ID: c.AdapterID, Endpoint: c.AdapterEndpoint}, row.ID, row.Attempt)
	switch {
	case adaptercall.IsTokenRefusal(err):
		// A configuration fault (signing key, public keys or adapter id disagree), as on Execute:
		// the work the cancellation was for goes on.
		s.log.Error("adapter refused the platform's token on the cancellation", append(fields,
			zap.String("adapter_id", c.AdapterID), zap.Error(err))...)
		return
	case err != nil:
		s.log.Info("adapter did not take the cancellation", append(fields, zap.Error(err))...)
		return
	}
	s.log.Info("adapter asked to stop the cancelled attempt", append(fields, zap.Bool("stopped", stopped))...)
}

// ListExecutions implements GatewayService.ListExecutions.
func (s *Server) ListExecutions(ctx context.Context, req *gatewayv1.ListExecutionsRequest) (*gatewayv1.ListExecutionsResponse, error) {
	f := store.ListFilter{Capability: req.GetCapability(), Limit: int(req.GetPageSize())}
	switch {
	case f.Limit < 0 || f.Limit > MaxPageSize:
		return nil, apperr.Invalid("page_size", "must be between 1 and %d", MaxPageSize)
	case f.Limit == 0:
		f.Limit = DefaultPageSize
	}
	// A filter naming no possible capability matches nothing; one Postgres cannot compare (NUL)
	// would fail the query. Either is the caller's mistake.
	if f.Capability != "" && !capabilityPattern.MatchString(f.Capability) {
		return nil, apperr.Invalid("capability", "%s is not a capability name", jsonbound.Quote(f.Capability))
	}
	if req.GetStatus() != executionv1.ExecutionStatus_EXECUTION_STATUS_UNSPECIFIED {
		if f.Status = execution.StatusFromProto(req.GetStatus()); f.Status == "" {
			return nil, apperr.Invalid("status", "unknown status %v", req.GetStatus())
		}
	}
	if tok := req.GetPageToken(); tok != "" {
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || uuid.Validate(string(raw)) != nil {
			return nil, apperr.Invalid("page_token", "not a token from a previous page")
		}
		f.Before = string(raw)
	}
	var err error
	if f.CreatedAfter, err = optTimestamp("created_after", req.GetCreatedAfter()); err != nil {
		return nil, err
	}
	if f.CreatedBefore, err = optTimestamp("created_before", req.GetCreatedBefore()); err != nil {
		return nil, err
	}
	if f.Query = req.GetQuery(); len(f.Query) > IdempotencyKeyMax || !ValidIdempotencyKey(f.Query) {
		return nil, apperr.Invalid("query", "an execution id or the start of an idempotency key: at most %d printable characters without spaces", IdempotencyKeyMax)
	}
	app, err := listApplication(ctx, req.GetApplicationId(), "executions")
	if err != nil {
		return nil, err
	}
	// One row past the page says whether another page follows: the last page carries no
	// next_page_token (a token on it led to an empty page).
	size := f.Limit
	f.Limit++
	rows, err := s.store.ExecutionList(ctx, app, f)
	if err != nil {
		return nil, err
	}
	resp := &gatewayv1.ListExecutionsResponse{}
	if len(rows) > size {
		rows = rows[:size]
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(rows[len(rows)-1].ID))
	}
	for _, r := range rows {
		e, err := listItem(r)
		if err != nil {
			return nil, err
		}
		resp.Executions = append(resp.Executions, e)
	}
	return resp, nil
}

// listApplication is the application whose executions or events (what) a list or a redrive
// reads: the caller's own, or for the operator (admin token) the one named, or every
// application's when none is.
func listApplication(ctx context.Context, named, what string) (string, error) {
	if isOperator(ctx) {
		if named != "" && !applicationPattern.MatchString(named) {
			return "", apperr.Invalid("application_id", "%s is not an application id", jsonbound.Quote(named))
		}
		return named, nil // store.AnyApplication when none is named
	}
	app := applicationID(ctx)
	if app == "" {
		return "", apperr.Unauthenticated("no application for this call")
	}
	if named != "" && named != app {
		return "", apperr.Invalid("application_id", "an application's key reaches its own %s only; leave application_id empty", what)
	}
	return app, nil
}

// SetConsumer implements GatewayService.SetConsumer. Either kind of consumer gets a signing
// secret (kept if the application has one): both kinds' deliveries are signed with it, and
// switching kinds keeps the secret the application knows.
func (s *Server) SetConsumer(ctx context.Context, req *gatewayv1.SetConsumerRequest) (*gatewayv1.SetConsumerResponse, error) {
	var kind string
	var register func(ctx context.Context, applicationID string, sealedNew []byte) ([]byte, error)
	resp := &gatewayv1.SetConsumerResponse{}
	if err := s.checkConsumer(ctx, req); err != nil {
		return nil, err
	}
	switch c := req.GetConsumer().(type) {
	case *gatewayv1.SetConsumerRequest_Webhook:
		url := c.Webhook.GetUrl()
		kind = "webhook"
		register = func(ctx context.Context, app string, sealedNew []byte) ([]byte, error) {
			return s.store.ConsumerSetWebhook(ctx, app, url, sealedNew)
		}
		resp.Consumer = &gatewayv1.SetConsumerResponse_Webhook{Webhook: &gatewayv1.WebhookConsumer{Url: url}}
	case *gatewayv1.SetConsumerRequest_Grpc:
		g := store.GRPCConsumer{Target: c.Grpc.GetTarget(), Plaintext: c.Grpc.GetPlaintext(), CAPEM: c.Grpc.CaPem}
		kind = "grpc"
		register = func(ctx context.Context, app string, sealedNew []byte) ([]byte, error) {
			return s.store.ConsumerSetGRPC(ctx, app, g, sealedNew)
		}
		// The consumer as registered: plaintext always said, the CA when one was given.
		resp.Consumer = &gatewayv1.SetConsumerResponse_Grpc{Grpc: &gatewayv1.GrpcConsumer{
			Target: g.Target, Plaintext: &g.Plaintext, CaPem: g.CAPEM}}
	default:
		return nil, apperr.Invalid("consumer", "required: {\"webhook\": {\"url\": \"https://...\"}} or {\"grpc\": {\"target\": \"host:port\"}}")
	}
	fresh, err := webhooks.NewSecret()
	if err != nil {
		return nil, err
	}
	sealedFresh, err := s.box.Seal([]byte(fresh))
	if err != nil {
		return nil, err
	}
	sealed, err := register(ctx, applicationID(ctx), sealedFresh)
	if err != nil {
		return nil, err
	}
	plain, err := s.box.Open(sealed)
	if errors.Is(err, secret.ErrUnknownKey) {
		// The application's secret was sealed with a key this deployment no longer holds (a
		// rotated-out key, another environment's database): say so and how to recover.
		return nil, apperr.New(apperr.KindFailedPrecondition, errorsv1.ErrorReason_SIGNING_SECRET_UNREADABLE.String(),
			"the application's signing secret was sealed with a key that is not configured "+
				"(INTEGRATIONS_SECRET_KEY, INTEGRATIONS_SECRET_KEY_PREVIOUS); issue a new one with POST /v1/consumer:rotate-secret")
	}
	if err != nil {
		return nil, fmt.Errorf("open signing secret: %w", err)
	}
	s.log.Info("consumer registered", log.ApplicationID(applicationID(ctx)), zap.String("kind", kind))
	resp.SigningSecret = string(plain)
	return resp, nil
}
