// Package riversw is River doing the same work as the platform (issue 13, item 7): what a Go team
// would build instead of the execution gateway. It runs as a process of its own (Serve, started by
// the bench as `bench riversw-serve`):
//
//   - an HTTP handler, POST /executions, inserting one River job (kind "execute", queue
//     "execute") per request and answering 202 with the execution's id;
//   - an execute worker calling the SAME dummy adapter process as the platform over gRPC
//     (pkg/adaptercall, each call carrying a platform token signed with the stack's platform key,
//     as the execution-consumer's); on success, in ONE transaction, River's JobCompleteTx plus the
//     insert of a webhook job (kind "webhook", queue "webhook"); a retryable failure returns an
//     error (River retries it on its own schedule), a permanent one cancels the job;
//   - a webhook worker signing the event per Standard Webhooks (pkg/webhook) with the
//     application's secret and POSTing it to the receiver (the bench process's), a non-2xx answer
//     being retried by River.
//
// River is tuned as issue 13 says: two queues, FetchCooldown 10 ms, FetchPollInterval 100 ms, 100
// workers (per queue), LISTEN/NOTIFY on; its tables live in a schema of their own.
package riversw

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/bench/internal/accept"
	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// The tuning of issue 13.
const (
	FetchCooldown     = 10 * time.Millisecond
	FetchPollInterval = 100 * time.Millisecond
	Workers           = 100
	// PoolSize is the peer's pgx pool: the platform's services default to 16 connections each;
	// one process doing everything gets 24 (River's LISTEN holds one).
	PoolSize = 24
	// CallTimeout bounds one adapter call (the dummy's echo answers at once).
	CallTimeout = 30 * time.Second
)

// Queue names.
const (
	QueueExecute = "execute"
	QueueWebhook = "webhook"
)

// Config of the peer's process.
type Config struct {
	DatabaseURL string
	Schema      string // River's tables (accept.MigrateRiver); emptied at start
	Listen      string // HTTP address, e.g. 127.0.0.1:0
	// Adapter is the dummy adapter: its catalog id (the token's audience) and gRPC endpoint.
	AdapterID, AdapterAddr string
	// PlatformKey signs the platform tokens the adapter verifies.
	PlatformKey ed25519.PrivateKey
	// ReceiverURL and SigningSecret: where the events go and what signs them.
	ReceiverURL   string
	SigningSecret string
	// Capability is what the execute job asks the adapter for (dummy.echo).
	Capability string
}

// Description says how the peer is built and tuned.
func Description() string {
	return fmt.Sprintf("River v0.51.2 doing the same work, a process of its own: HTTP POST inserts an execute job; "+
		"worker calls the dummy adapter over gRPC (platform token); JobCompleteTx + insert of a webhook job in one transaction; "+
		"webhook worker signs (Standard Webhooks) and POSTs to the receiver; queues %s and %s of %d workers each, "+
		"FetchCooldown %s, FetchPollInterval %s, pool of %d", QueueExecute, QueueWebhook, Workers, FetchCooldown, FetchPollInterval, PoolSize)
}

// ExecuteArgs is the execution job.
type ExecuteArgs struct {
	ExecutionID string          `json:"execution_id"`
	Capability  string          `json:"capability"`
	Payload     json.RawMessage `json:"payload"`
}

// Kind is River's job kind.
func (ExecuteArgs) Kind() string { return "execute" }

// InsertOpts puts the job on its queue.
func (ExecuteArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueExecute, MaxAttempts: 10}
}

// WebhookArgs is the event delivery job.
type WebhookArgs struct {
	EventID string          `json:"event_id"`
	Body    json.RawMessage `json:"body"`
}

// Kind is River's job kind.
func (WebhookArgs) Kind() string { return "webhook" }

// InsertOpts puts the job on its queue.
func (WebhookArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueWebhook, MaxAttempts: 25}
}

// Event is the webhook's body: the fields the bench's tracker reads (data.execution_id) in the
// platform's shape.
type Event struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	Timestamp time.Time `json:"timestamp"`
	Data      EventData `json:"data"`
}

// EventData is the event's data.
type EventData struct {
	ExecutionID string           `json:"execution_id"`
	Capability  string           `json:"capability"`
	Status      string           `json:"status"`
	Attempt     int              `json:"attempt"`
	Result      *structpb.Struct `json:"result,omitempty"`
}

type executeWorker struct {
	river.WorkerDefaults[ExecuteArgs]
	pool     *pgxpool.Pool
	adapters *adaptercall.Pool
	adapter  adaptercall.Adapter
}

func (w *executeWorker) Work(ctx context.Context, job *river.Job[ExecuteArgs]) error {
	payload := &structpb.Struct{}
	if len(job.Args.Payload) > 0 {
		if err := payload.UnmarshalJSON(job.Args.Payload); err != nil {
			return river.JobCancel(fmt.Errorf("decode payload: %w", err))
		}
	}
	deadline := time.Now().Add(CallTimeout)
	callCtx, cancel := context.WithDeadline(ctx, deadline)
	out := w.adapters.Execute(callCtx, w.adapter, &adapterv1.ExecuteRequest{
		ExecutionId: job.Args.ExecutionID, Attempt: int32(job.Attempt), Capability: job.Args.Capability, //nolint:gosec // attempts ≤ MaxAttempts
		Payload: payload, DeadlineTime: timestamppb.New(deadline), DeadlineIn: durationpb.New(CallTimeout),
		Mode: executionv1.Mode_MODE_ASYNC,
	})
	cancel()
	switch out.Kind {
	case execution.OutcomeCompleted:
	case execution.OutcomeFailed:
		err := fmt.Errorf("adapter: %s %s", out.Failure.Class, out.Failure.Code)
		if out.Retryable {
			return err
		}
		return river.JobCancel(err)
	default:
		return river.JobCancel(fmt.Errorf("adapter answered kind %d, which this peer does not handle", out.Kind))
	}
	ev := Event{ID: "evt_" + uuid.NewString(), Type: "execution.succeeded", Timestamp: time.Now().UTC(),
		Data: EventData{ExecutionID: job.Args.ExecutionID, Capability: job.Args.Capability, Status: "succeeded", Attempt: job.Attempt, Result: out.Result}}
	body, err := json.Marshal(ev)
	if err != nil {
		return river.JobCancel(fmt.Errorf("encode event: %w", err))
	}
	// The settlement: the job's completion and the event's delivery job, one transaction.
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return err
	}
	if _, err := client.InsertTx(ctx, tx, WebhookArgs{EventID: ev.ID, Body: body}, nil); err != nil {
		return fmt.Errorf("insert webhook job: %w", err)
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

type webhookWorker struct {
	river.WorkerDefaults[WebhookArgs]
	http   *http.Client
	url    string
	secret string
}

func (w *webhookWorker) Work(ctx context.Context, job *river.Job[WebhookArgs]) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(job.Args.Body))
	if err != nil {
		return river.JobCancel(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if err := webhooks.SetHeaders(req.Header, []string{w.secret}, job.Args.EventID, time.Now(), job.Args.Body); err != nil {
		return river.JobCancel(fmt.Errorf("sign: %w", err))
	}
	resp, err := w.http.Do(req)
	if err != nil {
		return fmt.Errorf("deliver: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("deliver: receiver answered %s", resp.Status)
	}
	return nil
}

// Server is a running peer.
type Server struct {
	Addr     string // the HTTP listener's address
	pool     *pgxpool.Pool
	client   *river.Client[pgx.Tx]
	adapters *adaptercall.Pool
	srv      *http.Server
	capab    string
	// webhooks is the webhook worker's client: its idle connections to the receiver are closed
	// with the server, not left to the receiver to close.
	webhooks *http.Client
}

// Start empties River's job table, starts the River client and serves the HTTP handler.
func Start(ctx context.Context, c Config) (*Server, error) {
	if c.Capability == "" {
		return nil, errors.New("riversw: no capability")
	}
	pool, err := accept.Pool(ctx, c.DatabaseURL, PoolSize)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	if _, err := pool.Exec(ctx, "TRUNCATE "+pgx.Identifier{c.Schema, "river_job"}.Sanitize()); err != nil {
		pool.Close()
		return nil, fmt.Errorf("empty %s.river_job: %w", c.Schema, err)
	}
	s := &Server{pool: pool, adapters: adaptercall.NewPool(adaptercall.WithSigner(platformtoken.NewSigner(c.PlatformKey))), capab: c.Capability}
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &executeWorker{pool: pool, adapters: s.adapters,
		adapter: adaptercall.Adapter{ID: c.AdapterID, Endpoint: c.AdapterAddr}}); err != nil {
		s.closePool()
		return nil, err
	}
	s.webhooks = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: Workers}}
	if err := river.AddWorkerSafely(workers, &webhookWorker{http: s.webhooks, url: c.ReceiverURL, secret: c.SigningSecret}); err != nil {
		s.closePool()
		return nil, err
	}
	s.client, err = river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:            c.Schema,
		FetchCooldown:     FetchCooldown,
		FetchPollInterval: FetchPollInterval,
		Queues: map[string]river.QueueConfig{
			QueueExecute: {MaxWorkers: Workers},
			QueueWebhook: {MaxWorkers: Workers},
		},
		Workers: workers,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		s.closePool()
		return nil, fmt.Errorf("river client: %w", err)
	}
	if err := s.client.Start(ctx); err != nil {
		s.closePool()
		return nil, fmt.Errorf("start river client: %w", err)
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		_ = s.Close(ctx)
		return nil, err
	}
	s.Addr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /executions", s.accept)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *Server) closePool() {
	_ = s.adapters.Close()
	s.pool.Close()
}

// maxBody bounds a request's payload.
const maxBody = 64 << 10

// accept is POST /executions: body {"payload": {...}}; answers 202 {"execution_id": ...}.
func (s *Server) accept(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&in); err != nil {
		http.Error(w, "invalid JSON body", http.StatusBadRequest)
		return
	}
	if len(in.Payload) > 0 && in.Payload[0] != '{' {
		http.Error(w, "payload must be an object", http.StatusBadRequest)
		return
	}
	id := uuid.NewString()
	if _, err := s.client.Insert(r.Context(), ExecuteArgs{ExecutionID: id, Capability: s.capab, Payload: in.Payload}, nil); err != nil {
		http.Error(w, "insert failed; retry", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(map[string]string{"execution_id": id})
}

// Close stops serving and stops River (letting the jobs in hand finish).
func (s *Server) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var err error
	if s.srv != nil {
		err = s.srv.Shutdown(ctx)
	}
	if serr := s.client.Stop(ctx); serr != nil {
		err = errors.Join(err, fmt.Errorf("stop river client: %w", serr))
	}
	s.webhooks.CloseIdleConnections()
	s.closePool()
	return err
}
