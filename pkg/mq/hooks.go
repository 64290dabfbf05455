package mq

import (
	"net"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// testHooks let this package's tests observe and perturb the port at points that no action on
// the broker can reach deterministically (a confirm that never arrives, a settlement racing a
// reconnect). Set through Config.hooks, which only this package can reach; nil in production, and
// every field may be nil.
type testHooks struct {
	// wrapConn wraps the TCP connection under every AMQP or STOMP connection ("publish" or "consume").
	wrapConn func(purpose string, c net.Conn) net.Conn
	// copySending runs before a retry or dead-letter copy is written; copySent after it was
	// written and before its confirm is awaited.
	copySending func(queue string)
	copySent    func(queue string)
	// subscribed runs on the owner goroutine after each (re)subscription of a consumer.
	subscribed func(route string, gen uint64)
	// settling runs on the owner goroutine before a handler's verdict is written (ack or nack).
	settling func(route string, d *amqp.Delivery)
	// stompSettling runs on a STOMP worker before it acknowledges a delivery of conn.
	stompSettling func(conn *stomp.Conn, m *stomp.Message)
	// stompRetiring runs on a STOMP consumer's owner goroutine when it retires a subscription and
	// is about to wait for the acknowledgements its workers are writing on it.
	stompRetiring func()
	// settled runs on the owner goroutine after an ack or nack the broker accepted.
	settled func(route, messageID string, ev event)
	// declared runs after queues were declared (created, or found to exist): tests must not
	// delete a just-created at-least-once queue (see deadLetterVia).
	declared func()
}

var noHooks = &testHooks{}

func (p *port) noteDeclared() {
	if h := p.hooks().declared; h != nil {
		h()
	}
}

func (p *port) hooks() *testHooks {
	if p.cfg.hooks == nil {
		return noHooks
	}
	return p.cfg.hooks
}
