package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// The list queries keep their index under a generic plan: pgx caches each statement, and after
// the fifth execution Postgres may plan it once for any parameters. Each case prepares the
// statement the store would send, executes it six times, then checks the plan of a seventh —
// and the forced generic plan too, which is what a long-lived connection ends up with — for an
// index scan whose index condition holds the filter. On 20,000 rows a sequential scan, or an
// index walked in full with the filter applied row by row, costs far more than the index range.
func TestListQueriesKeepTheirIndexUnderGenericPlans(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	seedLists(t, s.Pool, 20000)

	var execID, midExec, midEvent string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT execution_id::text FROM integration_events
		WHERE delivery_status = 'dead' LIMIT 1`).Scan(&execID))
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT id::text FROM executions ORDER BY id OFFSET 10000 LIMIT 1`).Scan(&midExec))
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT id::text FROM integration_events ORDER BY id OFFSET 10000 LIMIT 1`).Scan(&midEvent))
	since := time.Now().Add(-time.Hour)

	type tc struct {
		name  string
		query string
		args  []any
		// cond must appear in an index scan's index condition.
		cond string
	}
	ev := func(f EventFilter) (string, []any) { f.Limit = 50; return eventListQuery(dbtest.TestApp, f) }
	ex := func(f ListFilter) (string, []any) { f.Limit = 50; return executionListQuery(dbtest.TestApp, f) }
	var cases []tc
	add := func(name, cond string, q string, args []any) {
		cases = append(cases, tc{name: name, query: q, args: args, cond: cond})
	}
	q, a := ev(EventFilter{Status: execution.EventDead})
	add("events by status", "delivery_status", q, a)
	q, a = ev(EventFilter{Status: execution.EventDead, Before: midEvent})
	add("events by status, next page", "delivery_status", q, a)
	q, a = ev(EventFilter{ExecutionID: execID})
	add("events by execution", "execution_id", q, a)
	q, a = ev(EventFilter{Before: midEvent, Since: &since})
	add("events, next page", "id <", q, a)
	q, a = ex(ListFilter{Before: midExec})
	add("executions, next page", "id <", q, a)
	q, a = ex(ListFilter{Before: midExec, Status: "succeeded", Capability: dbtest.TestCapability})
	add("executions by status and capability, next page", "id <", q, a)

	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := s.Pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			name := fmt.Sprintf("list_plan_%d", i)
			_, err = conn.Exec(ctx, "PREPARE "+name+" AS "+c.query)
			require.NoError(t, err)
			defer conn.Exec(ctx, "DEALLOCATE "+name) //nolint:errcheck // the schema goes with the test
			execute := name + "(" + literals(c.args) + ")"
			for range 6 {
				_, err = conn.Exec(ctx, "EXECUTE "+execute)
				require.NoError(t, err)
			}
			explain := func() ([]planNode, string) {
				var plan []byte
				require.NoError(t, conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE "+execute).Scan(&plan))
				return indexScans(t, plan), string(plan)
			}
			assertIndexCond(t, explain, c.cond, "after six executions")
			_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
			require.NoError(t, err)
			defer conn.Exec(ctx, "RESET plan_cache_mode") //nolint:errcheck // reset for the pool's next user
			assertIndexCond(t, explain, c.cond, "generic plan")
		})
	}
}

func assertIndexCond(t *testing.T, explain func() ([]planNode, string), cond, when string) {
	t.Helper()
	scans, plan := explain()
	for _, n := range scans {
		if strings.Contains(n.IndexCond, cond) {
			return
		}
	}
	assert.Failf(t, "no index condition on "+cond, "%s: index scans %+v in %s", when, scans, plan)
}

type planNode struct {
	NodeType  string     `json:"Node Type"`
	IndexName string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Plans     []planNode `json:"Plans"`
}

// indexScans returns the index scans of an EXPLAIN (FORMAT JSON) plan.
func indexScans(t *testing.T, doc []byte) []planNode {
	t.Helper()
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(doc, &plans))
	require.Len(t, plans, 1)
	var out []planNode
	var walk func(n planNode)
	walk = func(n planNode) {
		if n.IndexName != "" {
			out = append(out, planNode{NodeType: n.NodeType, IndexName: n.IndexName, IndexCond: n.IndexCond})
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plans[0].Plan)
	return out
}

// literals renders the statement's arguments as SQL literals for EXECUTE.
func literals(args []any) string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case execution.EventStatus:
			out[i] = execution.Literal(v)
		case execution.Status:
			out[i] = execution.Literal(v)
		case time.Time:
			out[i] = "'" + v.UTC().Format(time.RFC3339Nano) + "'"
		default:
			out[i] = fmt.Sprint(v)
		}
	}
	return strings.Join(out, ", ")
}

// seedLists inserts n settled executions of the test application, each with its completion
// event, one event in a hundred dead, and analyzes both tables.
func seedLists(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO executions (id, application_id, capability, mode, status, attempt, max_attempts,
			payload, request_hash, deadline_at, created_at, settled_at)
		SELECT gen_random_uuid(), $1, $2, 'async', 'succeeded', 1, 3, '{}', '\x00', now() + interval '1 day',
			now() - make_interval(secs => i), now()
		FROM generate_series(1, $3::int) i`, dbtest.TestApp, dbtest.TestCapability, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, created_at,
			relayed_at, delivery_status, attempts, delivered_at, dead_at)
		SELECT gen_random_uuid(), application_id, id, 'execution.complete', '{}', created_at, created_at,
			CASE WHEN row_number() OVER () % 100 = 0 THEN 'dead' ELSE 'delivered' END, 1,
			CASE WHEN row_number() OVER () % 100 = 0 THEN NULL ELSE now() END,
			CASE WHEN row_number() OVER () % 100 = 0 THEN now() END
		FROM executions`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE executions, integration_events`)
	require.NoError(t, err)
}
