package deliver

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/services/event-router/internal/relay"
)

// chaosScale is the time scale of the chaos run, which spent the events route's port budget on
// dead connections in milliseconds.
const chaosScale = 0.001

// pgProxy forwards TCP connections to Postgres and can cut them: while it is down, every open
// connection is closed and every new one is closed as soon as it is accepted, as when Postgres
// restarts or an operator terminates every backend — what the deliverer's pool sees is dead pooled
// connections, then failing dials, then a database that answers again.
type pgProxy struct {
	ln     net.Listener
	target string
	down   atomic.Bool
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func newPGProxy(t *testing.T) *pgProxy {
	t.Helper()
	u, err := url.Parse(dbtest.BaseURL())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &pgProxy{ln: ln, target: u.Host, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(func() { _ = ln.Close(); p.cut() })
	return p
}

// url is the schema's URL through the proxy.
func (p *pgProxy) url(t *testing.T, schemaURL string) string {
	t.Helper()
	u, err := url.Parse(schemaURL)
	require.NoError(t, err)
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *pgProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			_ = c.Close()
			continue
		}
		go p.forward(c)
	}
}

func (p *pgProxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
	}
	go pipe(up, c)
	go pipe(c, up)
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// cut closes every open connection.
func (p *pgProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// setDown starts (cutting every open connection) or ends an outage.
func (p *pgProxy) setDown(down bool) {
	p.down.Store(down)
	if down {
		p.cut()
	}
}

// blipRelay is the relay as the service runs it in a chaos-scaled run, without its in-process
// hand-off (the tests below cut only the deliverer's database connections, and are about the
// notices the broker carries; in the service the relay and the deliverer share one pool, so a
// relay that can claim has a deliverer that can record): the DLQ looked at every
// second, the stale-notice release out of the way (an hour), so that only the dead letter can
// explain a recovery.
func blipRelay(t *testing.T) *relay.Options {
	t.Helper()
	_, budget, err := mq.RetryDelays(routes.Events, chaosScale)
	require.NoError(t, err)
	return &relay.Options{Interval: 50 * time.Millisecond, StaleAfter: time.Hour, RecoverEvery: time.Second,
		NoticeBudget: budget}
}

// okReceiver answers every delivery 204.
func okReceiver(t *testing.T) *receiver {
	return newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
}

// The chaos run's failure: the deliverer's database connections die. With the events route as it
// is declared (its retry floor) in a run whose time scale would make its delays 1, 5 and 30 ms, an
// outage of 2 s is retried through — the notice is not dead-lettered and the event is delivered
// once the database answers.
func TestDeadConnectionsForTwoSecondsDoNotDeadLetter(t *testing.T) {
	t.Parallel()
	proxy := newPGProxy(t)
	events := routes.Events
	s := dbtest.NewSchema(t)
	b := setup(t, options{schema: s, route: &events, brokerScale: chaosScale, deliverURL: proxy.url(t, s.URL),
		relay: blipRelay(t), deadLetters: true, brokerOnly: true})
	rc := okReceiver(t)
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)

	// A first event, delivered through the proxy, leaves live connections in the deliverer's pool.
	b.awaitStatus(t, b.newEvent(t, dbtest.TestApp), "delivered", 10*time.Second)

	proxy.setDown(true)
	downAt := time.Now()
	id := b.newEvent(t, dbtest.TestApp)
	// The deliverer fails on it at least once while the database is away.
	require.Eventually(t, func() bool { return b.broker.Counters(events.Name).Retried > 0 }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(time.Until(downAt.Add(2 * time.Second))) // the outage's length, not a synchronisation
	proxy.setDown(false)

	b.awaitStatus(t, id, "delivered", 15*time.Second)
	c := b.broker.Counters(events.Name)
	assert.Zero(t, c.DeadLettered, "the budget outlasted the outage")
	assert.GreaterOrEqual(t, c.Retried, uint64(2), "retried through the outage (1 s, then 5 s)")
	dls, err := b.broker.DeadLetters(context.Background(), events.Name, 10)
	require.NoError(t, err)
	assert.Empty(t, dls)
	_, attempts := b.status(t, id)
	assert.Equal(t, 1, attempts, "one delivery attempt: the failures were the deliverer's own")
}

// An outage longer than the budget dead-letters the notice. The relay finds it in the DLQ, the
// event is delivered within seconds of the database answering again — not after the stale-notice
// window, an hour here — and once it is, its dead letter is cleared; a dead letter the database
// does not explain (a notice of no event) stays.
func TestDeadLetteredNoticeIsRecoveredInSecondsAndCleared(t *testing.T) {
	t.Parallel()
	proxy := newPGProxy(t)
	events := routes.Events
	s := dbtest.NewSchema(t)
	b := setup(t, options{schema: s, route: &events, brokerScale: chaosScale, deliverURL: proxy.url(t, s.URL),
		relay: blipRelay(t), deadLetters: true, brokerOnly: true})
	rc := okReceiver(t)
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	missing := "00000000-0000-4000-8000-000000000001"
	b.notify(t, dbtest.TestApp, missing, 1)
	require.Eventually(t, func() bool { return b.broker.Counters(events.Name).Rejected == 1 }, 10*time.Second, 10*time.Millisecond)

	proxy.setDown(true)
	id := b.newEvent(t, dbtest.TestApp)
	// The budget (1 s, 5 s, 5 s) runs out while the database is away.
	require.Eventually(t, func() bool { c := b.broker.Counters(events.Name); return c.DeadLettered-c.Rejected == 1 }, 30*time.Second, 10*time.Millisecond)
	proxy.setDown(false)
	back := time.Now()
	st, _ := b.status(t, id)
	require.Equal(t, "pending", st)

	b.awaitStatus(t, id, "delivered", 5*time.Second)
	t.Logf("delivered %v after the database came back", time.Since(back))
	require.Eventually(t, func() bool { return b.relay.DeadLettersCleared() == 1 }, 5*time.Second, 10*time.Millisecond,
		"the dead letter of a delivered event is cleared")
	// Listing while the relay lists may hide what the relay holds: look until the view is whole.
	require.Eventually(t, func() bool {
		dls, err := b.broker.DeadLetters(context.Background(), events.Name, 10)
		return err == nil && len(dls) == 1 && dls[0].ID == missing
	}, 5*time.Second, 50*time.Millisecond, "only the unexplained dead letter stays")
	assert.Equal(t, int64(1), b.relay.NoticesRepublished(), "one fresh notice, from the dead letter")
	assert.Len(t, rc.requests(), 1, "delivered once")
}
