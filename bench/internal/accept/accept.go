// Package accept holds the workloads of the Accept scenario (issue 6, item 1): an async invoke of
// dummy.echo through the gateway over gRPC and over REST, and beside them the two peers measured
// at the same concurrency — the Postgres ceiling (a raw pgx transaction writing the two rows an
// accept writes) and River's Insert.
package accept

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/e2e/stack"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// Workload is one row kind of the scenario.
type Workload struct {
	Scenario  string // "accept", "postgres", "river"
	Transport string // "grpc", "rest", "pgx"
	// What says what one call does, for the report.
	What string
	// Prepare returns the call for a run with callers concurrent callers, and what to release
	// after it.
	Prepare func(ctx context.Context, callers int) (load.Op, func(), error)
}

// payload is the invocation payload: small, and the same for every call (no idempotency key, so
// every call is a new execution).
var payload = map[string]any{"bench": "accept"}

// GRPC invokes dummy.echo asynchronously through GatewayService.InvokeCapability, the API key as
// Bearer, on one client connection shared by the callers (as an application would).
func GRPC(st *stack.Stack) Workload {
	return Workload{
		Scenario: "accept", Transport: "grpc",
		What: "GatewayService.InvokeCapability(dummy.echo, MODE_ASYNC) over one gRPC connection, answered pending",
		Prepare: func(ctx context.Context, callers int) (load.Op, func(), error) {
			conn, err := st.Dial("gateway", "")
			if err != nil {
				return nil, nil, err
			}
			client := gatewayv1.NewGatewayServiceClient(conn)
			p, err := structpb.NewStruct(payload)
			if err != nil {
				return nil, nil, err
			}
			req := &gatewayv1.InvokeCapabilityRequest{Capability: stack.Capability, Mode: executionv1.Mode_MODE_ASYNC, Payload: p}
			op := func(ctx context.Context, _ int, _ int64) error {
				resp, err := client.InvokeCapability(grpcx.WithBearer(ctx, st.APIKey), req)
				if err != nil {
					return err
				}
				if s := resp.GetExecution().GetStatus(); s != executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING {
					return fmt.Errorf("answered %v, want pending", s)
				}
				return nil
			}
			return op, func() { _ = conn.Close() }, nil
		},
	}
}

// REST invokes dummy.echo asynchronously with POST /v1/capabilities/dummy.echo:invoke, keep-alive
// connections (one per caller).
func REST(st *stack.Stack) Workload {
	return Workload{
		Scenario: "accept", Transport: "rest",
		What: "POST /v1/capabilities/dummy.echo:invoke {mode: MODE_ASYNC}, keep-alive, answered 202",
		Prepare: func(ctx context.Context, callers int) (load.Op, func(), error) {
			tr := &http.Transport{MaxIdleConns: callers, MaxIdleConnsPerHost: callers, IdleConnTimeout: time.Minute}
			client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			url := st.RESTURL + "/v1/capabilities/" + stack.Capability + ":invoke"
			body := []byte(`{"mode": "MODE_ASYNC", "payload": {"bench": "accept"}}`)
			auth := "Bearer " + st.APIKey
			op := func(ctx context.Context, _ int, _ int64) error {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				if err != nil {
					return err
				}
				req.Header.Set("Authorization", auth)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				raw, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if err != nil {
					return err
				}
				if resp.StatusCode != http.StatusAccepted {
					return fmt.Errorf("answered %d: %.200s", resp.StatusCode, raw)
				}
				return nil
			}
			return op, tr.CloseIdleConnections, nil
		},
	}
}

// Postgres is the ceiling: one pgx transaction (BEGIN, two INSERTs, COMMIT) writing the rows an
// async accept writes — an executions row with the gateway's columns and a dispatches row — into
// the stack's schema (same tables, same indexes), on a pool of min(callers, maxConns) connections.
//
// The dispatch records are due a year from now, so that the stack leaves them alone: the ceiling
// is Postgres alone, not Postgres while the platform processes what it was given. They are
// deleted after the run (untimed).
func Postgres(st *stack.Stack, maxConns int) Workload {
	return Workload{
		Scenario: "postgres", Transport: "pgx",
		What: "BEGIN; INSERT executions (12 columns, as the gateway); INSERT dispatches (due in a year: the stack leaves them alone); COMMIT — pool of min(callers, -peer-pool) connections",
		Prepare: func(ctx context.Context, callers int) (load.Op, func(), error) {
			pool, err := Pool(ctx, st.SchemaURL, min(callers, maxConns))
			if err != nil {
				return nil, nil, err
			}
			raw := []byte(`{"bench":"accept"}`)
			h := sha256.Sum256(append([]byte(stack.Capability+"\x00async\x00"), raw...))
			op := func(ctx context.Context, _ int, _ int64) error {
				id, err := uuid.NewV7()
				if err != nil {
					return err
				}
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `
						INSERT INTO executions (id, application_id, capability, mode, status, attempt, max_attempts,
							payload, request_hash, idempotency_key, deadline_at, lease_expires_at)
						VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
						id, stack.AppID, stack.Capability, "async", "pending", 0, 10,
						raw, h[:], nil, time.Now().Add(24*time.Hour), nil); err != nil {
						return fmt.Errorf("insert execution: %w", err)
					}
					if _, err := tx.Exec(ctx, `INSERT INTO dispatches (execution_id, attempt, due_at) VALUES ($1, 1, now() + interval '1 year')`, id); err != nil {
						return fmt.Errorf("insert dispatch: %w", err)
					}
					return nil
				})
			}
			release := func() {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				defer cancel()
				if _, err := pool.Exec(cctx, `DELETE FROM executions e USING dispatches d
					WHERE d.execution_id = e.id AND d.due_at > now() + interval '300 days'`); err != nil {
					fmt.Fprintln(os.Stderr, "bench: delete the ceiling's rows:", err)
				}
				pool.Close()
			}
			return op, release, nil
		},
	}
}

// echoArgs is River's job: kind and payload of the same size class as the invocation's.
type echoArgs struct {
	Bench string `json:"bench"`
}

func (echoArgs) Kind() string { return "bench_echo" }

// River is River's Insert of a trivial job with an insert-only client (no queues are worked, as
// nothing but the insert is measured) on a pool of min(callers, maxConns) connections, River's
// tables in a schema of their own (see MigrateRiver).
func River(databaseURL, schema string, maxConns int) Workload {
	return Workload{
		Scenario: "river", Transport: "pgx",
		What: "river.Client.Insert(bench_echo job), insert-only client, pool of min(callers, -peer-pool) connections",
		Prepare: func(ctx context.Context, callers int) (load.Op, func(), error) {
			pool, err := Pool(ctx, databaseURL, min(callers, maxConns))
			if err != nil {
				return nil, nil, err
			}
			client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema})
			if err != nil {
				pool.Close()
				return nil, nil, fmt.Errorf("river client: %w", err)
			}
			args := echoArgs{Bench: "accept"}
			op := func(ctx context.Context, _ int, _ int64) error {
				_, err := client.Insert(ctx, args, nil)
				return err
			}
			return op, pool.Close, nil
		},
	}
}

// MigrateRiver creates schema and applies River's migrations to it.
func MigrateRiver(ctx context.Context, databaseURL, schema string) error {
	pool, err := Pool(ctx, databaseURL, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	return nil
}

// Pool opens a pgx pool of exactly conns connections (opened before it returns, so that no run
// pays for connecting).
func Pool(ctx context.Context, url string, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = int32(conns), int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// Open every connection now.
	conns2 := make([]*pgxpool.Conn, 0, conns)
	for range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			for _, c := range conns2 {
				c.Release()
			}
			pool.Close()
			return nil, err
		}
		conns2 = append(conns2, c)
	}
	for _, c := range conns2 {
		c.Release()
	}
	return pool, nil
}
