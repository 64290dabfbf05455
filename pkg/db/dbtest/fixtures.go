package dbtest

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// The standard test catalog's names and settings, for tests to assert against. TestCatalog
// declares them; fixtures_test.go checks that the two agree.
const (
	TestApp             = "app"
	TestAPIKey          = "test-api-key-0123456789"
	TestAdapter         = "adp"
	TestAdapterEndpoint = "127.0.0.1:50070"
	TestCapability      = "test.echo"
	TestMaxAttempts     = 3
	TestAsyncBudget     = 24 * time.Hour
	TestLease           = 2 * time.Minute
)

// TestRetryDelays returns the standard capability's delays before attempts 2 and 3. It is a
// function so that no test can change the value another test sees.
func TestRetryDelays() []time.Duration { return []time.Duration{time.Minute, 5 * time.Minute} }

// TestCatalog is a catalog with one async capability, TestCapability, served by TestAdapter and
// open to TestApp. Few attempts and short delays keep retry and attempt-limit paths reachable in a
// test; the lease differs from the catalog default so that a test sees it was read from the row.
const TestCatalog = `
applications:
  - id: app
    api_key: test-api-key-0123456789
adapters:
  - id: adp
    endpoint: 127.0.0.1:50070
    credential: test-credential-0123456789
capabilities:
  - name: test.echo
    adapter: adp
    modes: [async]
    max_attempts: 3
    async_budget: 24h
    retry_delays: [1m, 5m]
    lease: 2m
`

// ApplyCatalog parses a catalog YAML and applies it to the schema, as integrationsctl would. A
// ${VAR} reference fails the test: every variable counts as missing, so that no test depends on
// the environment it runs in.
func (s *Schema) ApplyCatalog(t testing.TB, yaml string) {
	t.Helper()
	c, err := catalog.Parse([]byte(yaml), func(string) (string, bool) { return "", false })
	require.NoError(t, err)
	require.NoError(t, catalog.Apply(context.Background(), s.Pool, c))
}

// Execution is an executions row for InsertExecution. A zero field takes a default that suits
// TestCatalog: a pending async execution of TestCapability for TestApp before its first attempt.
type Execution struct {
	// ID defaults to a new UUIDv7, time-ordered like the ids the gateway makes.
	ID string
	// Application defaults to TestApp.
	Application string
	// Capability defaults to TestCapability.
	Capability string
	// Mode defaults to "async".
	Mode string
	// Status defaults to "pending". A settled status (succeeded, failed, cancelled) sets
	// settled_at to now(), as the schema requires.
	Status execution.Status
	// Attempt is the current attempt; 0, the default, means none has started.
	Attempt int32
	// MaxAttempts defaults to TestMaxAttempts.
	MaxAttempts int32
	// Payload is JSON and defaults to {}. The request hash is its SHA-256.
	Payload string
	// Deadline defaults to a day after the database's now().
	Deadline time.Time
	// LeaseExpiresAt defaults, for a running execution, to 5 minutes after the database's now(),
	// so that the lease sweeper leaves it alone; other executions hold no lease.
	LeaseExpiresAt time.Time
}

// InsertExecution inserts e, with defaults for its zero fields, and returns its id. It inserts no
// attempt rows: see InsertAttempts.
func (s *Schema) InsertExecution(t testing.TB, e Execution) string {
	t.Helper()
	if e.ID == "" {
		id, err := uuid.NewV7()
		require.NoError(t, err)
		e.ID = id.String()
	}
	e.Application = cmp.Or(e.Application, TestApp)
	e.Capability = cmp.Or(e.Capability, TestCapability)
	e.Mode = cmp.Or(e.Mode, "async")
	e.Status = cmp.Or(e.Status, execution.StatusPending)
	e.Payload = cmp.Or(e.Payload, `{}`)
	e.MaxAttempts = cmp.Or(e.MaxAttempts, TestMaxAttempts)
	reqHash := sha256.Sum256([]byte(e.Payload))
	// Default times are taken from the database's clock, like the services' own.
	_, err := s.Pool.Exec(context.Background(), `
		INSERT INTO executions (id, application_id, capability, mode, status, attempt, max_attempts,
			payload, request_hash, deadline_at, lease_expires_at, settled_at)
		VALUES ($1, $2, $3, $4, $5::text, $6, $7, $8, $9,
			COALESCE($10::timestamptz, now() + interval '1 day'),
			CASE WHEN $11::timestamptz IS NOT NULL THEN $11::timestamptz
				WHEN $5::text = `+execution.Literal(execution.StatusRunning)+` THEN now() + interval '5 minutes' END,
			CASE WHEN $5::text IN (`+finalStatusesSQL+`) THEN now() END)`,
		e.ID, e.Application, e.Capability, e.Mode, e.Status, e.Attempt, e.MaxAttempts,
		e.Payload, reqHash[:], nullTime(e.Deadline), nullTime(e.LeaseExpiresAt))
	require.NoError(t, err)
	return e.ID
}

// Attempt is an execution_attempts row for InsertAttempts.
type Attempt struct {
	// N is the attempt's number, from 1.
	N int32
	// Outcome, if set ("failed", "succeeded", ...), ends the attempt at now(); empty leaves it
	// open, as a running attempt is.
	Outcome execution.AttemptOutcome
	// FailureClass is stored if set.
	FailureClass string
	// CallbackTokenHash defaults to the SHA-256 of a token unique to the execution and N.
	CallbackTokenHash []byte
}

// InsertAttempts inserts the attempt rows of the execution executionID, in order.
func (s *Schema) InsertAttempts(t testing.TB, executionID string, attempts ...Attempt) {
	t.Helper()
	for _, a := range attempts {
		hash := a.CallbackTokenHash
		if hash == nil {
			sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", executionID, a.N))
			hash = sum[:]
		}
		_, err := s.Pool.Exec(context.Background(), `
			INSERT INTO execution_attempts (execution_id, n, callback_token_hash, ended_at, outcome, failure_class)
			VALUES ($1, $2, $3, CASE WHEN $4::text IS NOT NULL THEN now() END, $4::text, $5::text)`,
			executionID, a.N, hash, nullString(string(a.Outcome)), nullString(a.FailureClass))
		require.NoError(t, err, "attempt %d of %s", a.N, executionID)
	}
}

// nullTime and nullString turn a zero value into SQL NULL.
// finalStatusesSQL lists the settled statuses as SQL literals.
var finalStatusesSQL = execution.Literal(execution.StatusSucceeded) + ", " + execution.Literal(execution.StatusFailed) + ", " +
	execution.Literal(execution.StatusCancelled)

func nullTime(v time.Time) any {
	if v.IsZero() {
		return nil
	}
	return v
}

func nullString(v string) any {
	if v == "" {
		return nil
	}
	return v
}
