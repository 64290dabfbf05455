package deliver

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/services/event-router/internal/relay"
)

// TestInProcessEventDeliveredOnceWithoutABrokerMessage: events relayed while the in-process
// queue has room are each delivered once, by the relay's own deliverer, and the broker carries no
// message for them (the port's counters). The application's bound is the events' number: none
// waits for a slot (the tests' deliverer has no patience, so one over the bound would go to the
// broker as a busy notice).
func TestInProcessEventDeliveredOnceWithoutABrokerMessage(t *testing.T) {
	t.Parallel()
	const n = 10
	b := setup(t, options{perApp: n})
	rc := okReceiver(t)
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = b.newEvent(t, dbtest.TestApp)
	}
	for _, id := range ids {
		b.awaitStatus(t, id, "delivered", 10*time.Second)
		_, attempts := b.status(t, id)
		assert.Equal(t, 1, attempts)
	}
	assert.Len(t, rc.requests(), n, "each event delivered once")
	assert.EqualValues(t, n, b.relay.HandedOff())
	assert.EqualValues(t, n, b.local.Handled())
	c := b.broker.Counters(b.route.Name)
	assert.Zero(t, c.Published, "no notice published")
	assert.Zero(t, c.Acknowledged, "no notice consumed")
}

// TestInProcessRetryGoesThroughTheBroker: an in-process attempt that fails schedules the next one
// as a delayed notice, which the broker carries back to a deliverer; the event is delivered on its
// second attempt.
func TestInProcessRetryGoesThroughTheBroker(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	id := b.newEvent(t, dbtest.TestApp)
	b.awaitStatus(t, id, "delivered", 10*time.Second)
	_, attempts := b.status(t, id)
	assert.Equal(t, 2, attempts)
	assert.EqualValues(t, 1, b.local.Noticed(), "the retry's notice")
	c := b.broker.Counters(b.route.Name)
	assert.EqualValues(t, 1, c.Published, "one message for the retry")
	assert.EqualValues(t, 1, c.Acknowledged, "the retry's notice delivered and acked")
}

// TestStalePathDeliversADeadReplicasEvents: an event a replica claimed for delivery in process
// and never delivered (it was killed: the event relayed, pending, under a claim that then
// expires) is published again by the stale-notice path and delivered.
func TestStalePathDeliversADeadReplicasEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, options{relay: &relay.Options{Interval: 50 * time.Millisecond, StaleAfter: time.Second,
		RecoverEvery: 100 * time.Millisecond}})
	rc := okReceiver(t)
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	// What EventClaimForRelay leaves of an event handed to a replica that died before its attempt.
	exec := b.s.InsertExecution(t, dbtest.Execution{Application: dbtest.TestApp})
	id := uuid.NewString()
	_, err := b.s.Pool.Exec(context.Background(), `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, relayed_at, delivery_claimed_until)
		VALUES ($1, $2, $3, 'execution.completed', '{}', now(), now() + interval '300 milliseconds')`,
		id, dbtest.TestApp, exec)
	require.NoError(t, err)
	b.awaitStatus(t, id, "delivered", 15*time.Second)
	assert.Len(t, rc.requests(), 1)
	assert.GreaterOrEqual(t, b.relay.HandedOff(), int64(1), "released, then relayed again")
}

// TestInProcessPerAppBoundHolds: with application A's receiver hanging, A never has more than its
// bound in flight, B's event is delivered meanwhile, and A's events over the bound are not
// dropped: they wait in the broker (busy notices) and are all delivered once A answers again.
func TestInProcessPerAppBoundHolds(t *testing.T) {
	t.Parallel()
	const perApp = 2
	b := setup(t, options{timeout: 30 * time.Second, perApp: perApp})
	release := make(chan struct{})
	var inFlight, most atomic.Int32
	hanging := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		select {
		case <-release:
			w.WriteHeader(http.StatusNoContent)
		case <-r.Context().Done():
		}
	})
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	healthy := okReceiver(t)
	b.setConsumer(t, dbtest.TestApp, "webhook", hanging.srv.URL)
	b.setConsumer(t, appB, "webhook", healthy.srv.URL)
	var ids []string
	for range 10 {
		ids = append(ids, b.newEvent(t, dbtest.TestApp))
	}
	require.Eventually(t, func() bool { return inFlight.Load() == perApp }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return b.local.Noticed() > 0 }, 10*time.Second, 10*time.Millisecond,
		"A's events over the bound go to the broker")
	idB := b.newEvent(t, appB)
	b.awaitStatus(t, idB, "delivered", 2*time.Second)
	close(release)
	released = true
	for _, id := range ids {
		b.awaitStatus(t, id, "delivered", 20*time.Second)
	}
	assert.LessOrEqual(t, most.Load(), int32(perApp), "A never exceeds its bound")
}

// TestDeadReplicasHandOffIsRelayedAgainBeforeTheStaleWindow: an event a replica claimed for
// delivery in process and never delivered carries the hand-off's mark; once the mark and the
// claim are past, the relay's recovery gives it back to the relay — the stale-notice window (an
// hour here) plays no part — and it is delivered once.
func TestDeadReplicasHandOffIsRelayedAgainBeforeTheStaleWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, options{relay: &relay.Options{Interval: 50 * time.Millisecond, StaleAfter: time.Hour,
		RecoverEvery: 100 * time.Millisecond}})
	rc := okReceiver(t)
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	exec := b.s.InsertExecution(t, dbtest.Execution{Application: dbtest.TestApp})
	id := uuid.NewString()
	// What EventClaimForRelay leaves of an event handed to a replica that died before its attempt.
	_, err := b.s.Pool.Exec(context.Background(), `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, relayed_at,
			relay_claimed_until, delivery_claimed_until)
		VALUES ($1, $2, $3, 'execution.completed', '{}', now(), now() + interval '300 milliseconds', now() + interval '300 milliseconds')`,
		id, dbtest.TestApp, exec)
	require.NoError(t, err)
	b.awaitStatus(t, id, "delivered", 5*time.Second)
	assert.Len(t, rc.requests(), 1)
	var marked bool
	require.NoError(t, b.s.Pool.QueryRow(context.Background(),
		`SELECT relay_claimed_until IS NOT NULL FROM integration_events WHERE id = $1`, id).Scan(&marked))
	assert.False(t, marked, "the record ends the hand-off's mark")
}
