package stomp

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests of this file assert how ActiveMQ Classic 5.17 behaves where the seed's Artemis lessons
// (docs/decisions.md, "STOMP on ActiveMQ Classic, measured") might not hold. A broker upgrade that
// changes one of them fails here, loudly, before the message port relies on the old behaviour.

// dlqOf subscribes to ActiveMQ's shared dead-letter queue, selecting the messages of one test.
func dlqOf(t *testing.T, c *Conn, testID string) *Subscription {
	t.Helper()
	return subscribe(t, c, "/queue/ActiveMQ.DLQ", SubscribeOptions{Selector: "test_id = '" + testID + "'"})
}

// NACK is not a redelivery on Classic: a persistent message goes straight to ActiveMQ.DLQ (no
// redelivery policy, no count), a non-persistent one is dropped. The live consumer never sees it
// again.
func TestQuirkNackDeadLettersOrDrops(t *testing.T) {
	t.Parallel()
	c := dial(t, stompURL(t))
	q := queue(t)
	send(t, c, q, "persistent", Header{"persistent", "true"}, Header{"test_id", q})
	send(t, c, q, "non-persistent", Header{"test_id", q})
	s := subscribe(t, c, q, SubscribeOptions{})
	ids := map[string]string{}
	for range 2 {
		m := recv(t, s, 5*time.Second)
		ids[string(m.Body)] = m.MessageID
		require.NoError(t, c.Nack(testCtx(t, 5*time.Second), m.AckID))
	}
	noMessage(t, s, time.Second)

	d := dlqOf(t, c, q)
	m := recv(t, d, 5*time.Second)
	require.Equal(t, "persistent", string(m.Body))
	require.Equal(t, q, m.Value("original-destination"))
	require.Equal(t, ids["persistent"], m.MessageID, "the dead letter keeps its message-id")
	require.NoError(t, c.Ack(testCtx(t, 5*time.Second), m.AckID))
	noMessage(t, d, 500*time.Millisecond) // the non-persistent one is gone
}

// ACK inside a transaction, then ABORT: unlike Artemis the message is not destroyed, but (as on
// Artemis for an unsettled delivery) it comes back only when the consumer goes away.
func TestQuirkAckInAbortedTransaction(t *testing.T) {
	t.Parallel()
	u := stompURL(t)
	c := dial(t, u)
	q := queue(t)
	send(t, c, q, "tx", Header{"persistent", "true"})
	s := subscribe(t, c, q, SubscribeOptions{})
	m := recv(t, s, 5*time.Second)
	ctx := testCtx(t, 5*time.Second)
	require.NoError(t, c.Begin(ctx, "tx1"))
	require.NoError(t, c.Ack(ctx, m.AckID, Header{"transaction", "tx1"}))
	require.NoError(t, c.Abort(ctx, "tx1"))
	noMessage(t, s, time.Second) // not redelivered to the live consumer
	require.NoError(t, c.Close(ctx))

	c2 := dial(t, u)
	again := recv(t, subscribe(t, c2, q, SubscribeOptions{}), 5*time.Second)
	require.Equal(t, "tx", string(again.Body))
	require.Equal(t, "true", again.Value("redelivered"))
	require.Equal(t, m.MessageID, again.MessageID)
}

// An unacknowledged delivery comes back after UNSUBSCRIBE (same connection) and after a
// disconnect, marked redelivered:true, with the same message-id (unlike Artemis, which mints a new
// one): on Classic message-id is a stable identity. Repeated disconnects do not dead-letter it by
// a delivery count: the broker's redelivery policy does not act over STOMP.
func TestQuirkUnackedRedeliveredOnUnsubscribeAndDisconnect(t *testing.T) {
	t.Parallel()
	u := stompURL(t)
	c := dial(t, u)
	q := queue(t)
	send(t, c, q, "held", Header{"persistent", "true"})
	s := subscribe(t, c, q, SubscribeOptions{})
	first := recv(t, s, 5*time.Second)
	require.Empty(t, first.Value("redelivered"), "a first delivery has no redelivered header")
	require.NoError(t, s.Unsubscribe(testCtx(t, 5*time.Second)))

	m := recv(t, subscribe(t, c, q, SubscribeOptions{}), 5*time.Second)
	require.Equal(t, "true", m.Value("redelivered"), "after UNSUBSCRIBE")
	require.Equal(t, first.MessageID, m.MessageID)
	require.NotEqual(t, first.AckID, m.AckID, "a new ack id per delivery")
	require.NoError(t, c.Close(testCtx(t, 5*time.Second)))

	for i := range 8 { // past ActiveMQ's default maximumRedeliveries (6)
		ci := dial(t, u)
		m = recv(t, subscribe(t, ci, q, SubscribeOptions{}), 5*time.Second)
		require.Equal(t, "true", m.Value("redelivered"), "after disconnect %d", i+1)
		require.Equal(t, first.MessageID, m.MessageID)
		require.NoError(t, ci.Close(testCtx(t, 5*time.Second)))
	}
}

// ActiveMQ sends timestamp and expires as epoch milliseconds (expires:0 for none), and takes
// expires the same way: a past one drops the message. An ISO-8601 expires or timestamp is not
// answered with an ERROR: the broker closes the connection, so the RECEIPT never comes (the seed
// warned of silent rejection on Artemis for the opposite format).
func TestQuirkTimestampFormats(t *testing.T) {
	t.Parallel()
	u := stompURL(t)
	c := dial(t, u)
	q := queue(t)
	before := time.Now()
	send(t, c, q, "expired", Header{"expires", strconv.FormatInt(time.Now().Add(-time.Minute).UnixMilli(), 10)})
	future := time.Now().Add(time.Hour).UnixMilli()
	send(t, c, q, "fresh", Header{"expires", strconv.FormatInt(future, 10)})
	send(t, c, q, "plain")

	for _, h := range []string{"expires", "timestamp"} {
		ci := dial(t, u)
		err := ci.Send(testCtx(t, 5*time.Second), q, []Header{{h, time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}}, []byte("iso"))
		require.ErrorIs(t, err, ErrOutcomeUnknown, "ISO-8601 %s: no receipt", h)
		require.ErrorContains(t, ci.Err(), "closed by the broker", "ISO-8601 %s: the broker hangs up without an ERROR frame", h)
	}

	s := subscribe(t, c, q, SubscribeOptions{})
	m := recv(t, s, 5*time.Second)
	require.Equal(t, "fresh", string(m.Body), "the past-expires message was dropped")
	require.Equal(t, strconv.FormatInt(future, 10), m.Value("expires"))
	ts, err := strconv.ParseInt(m.Value("timestamp"), 10, 64)
	require.NoError(t, err, "timestamp is epoch milliseconds")
	require.InDelta(t, before.UnixMilli(), ts, float64(time.Minute.Milliseconds()))
	m = recv(t, s, 5*time.Second)
	require.Equal(t, "plain", string(m.Body))
	require.Equal(t, "0", m.Value("expires"), "no expiry is expires:0")
	noMessage(t, s, 300*time.Millisecond) // nothing of the ISO-8601 sends arrived
}

// Artemis's scheduled-delivery header is ignored by Classic (delivered at once, header kept);
// Classic's own is AMQ_SCHEDULED_DELAY (TestScheduledDelay: its RECEIPT comes at once, the
// message after the delay).
func TestQuirkArtemisScheduleHeaderIgnored(t *testing.T) {
	t.Parallel()
	c := dial(t, stompURL(t))
	q := queue(t)
	s := subscribe(t, c, q, SubscribeOptions{})
	// A minute ahead: delivered within 30 s is "at once", with room for a loaded machine, and
	// far from honouring the header.
	at := strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)
	start := time.Now()
	send(t, c, q, "artemis", Header{"_AMQ_SCHED_DELIVERY", at})
	m := recv(t, s, 30*time.Second) // well before the minute it asked for
	require.Less(t, time.Since(start), 30*time.Second)
	require.Equal(t, at, m.Value("_AMQ_SCHED_DELIVERY"))
}

// browser:true lists a queue without consuming it, and ends the listing with a MESSAGE carrying
// browser:end (and no body); a selector on a custom header (an identifier: no hyphen) picks one
// message, and so does JMSMessageID on the message-id: either can pick one dead letter to redrive. A selector the broker cannot parse (here a
// quoted, hyphenated header name: a hyphen reads as minus) is an ERROR that ends the connection.
func TestQuirkBrowseAndSelector(t *testing.T) {
	t.Parallel()
	u := stompURL(t)
	c := dial(t, u)
	q := queue(t)
	for _, k := range []string{"one", "two", "three"} {
		send(t, c, q, k, Header{"persistent", "true"}, Header{"x_key", k})
	}

	b := subscribe(t, c, q, SubscribeOptions{Browser: true, Ack: AckAuto})
	ids := map[string]string{}
	for _, k := range []string{"one", "two", "three"} {
		m := recv(t, b, 5*time.Second)
		require.Equal(t, k, string(m.Body))
		ids[k] = m.MessageID
	}
	end := recv(t, b, 5*time.Second)
	require.Equal(t, "end", end.Value("browser"))
	require.Empty(t, end.Body)
	require.NoError(t, b.Unsubscribe(testCtx(t, 5*time.Second)))

	for _, sel := range []struct{ selector, want string }{
		{"x_key = 'two'", "two"},
		{"JMSMessageID = '" + ids["three"] + "'", "three"},
	} {
		s := subscribe(t, c, q, SubscribeOptions{Selector: sel.selector})
		m := recv(t, s, 5*time.Second)
		require.Equal(t, sel.want, string(m.Body), sel.selector)
		require.NoError(t, c.Ack(testCtx(t, 5*time.Second), m.AckID))
		noMessage(t, s, 300*time.Millisecond)
		require.NoError(t, s.Unsubscribe(testCtx(t, 5*time.Second)))
	}

	rest := recv(t, subscribe(t, c, q, SubscribeOptions{}), 5*time.Second)
	require.Equal(t, "one", string(rest.Body), "browsing consumed nothing; each selector took only its match")

	bad := dial(t, u)
	_, err := bad.Subscribe(testCtx(t, 5*time.Second), q, SubscribeOptions{Selector: `"x-key" = 'two'`})
	var se *ServerError
	require.ErrorAs(t, err, &se)
	<-bad.Done()
}
