package mq

import (
	"net"
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
	// subscribed runs on the owner goroutine after each (re)subscription of a consumer, with its
	// generation (its channel's, or its connection's).
	subscribed func(route string, gen uint64)
	// settling runs on a worker before a handler's verdict is written (an ack, a requeue).
	// behind settles the same delivery behind the port's back, so that the broker refuses the
	// port's own settlement.
	settling func(m *Message, behind func())
	// retiring runs on a STOMP consumer's owner goroutine when it retires a subscription and is
	// about to wait for the acknowledgements its workers are writing on it.
	retiring func()
	// settled runs after a settlement the broker took (an ack, a requeue), not a probe's.
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

// writeCopy writes a retry or dead-letter copy to queue with write, between the copySending and
// copySent hooks, and returns what write returned: the wait for the broker's confirm (or RECEIPT).
func writeCopy[W any](h *testHooks, queue string, write func() W) W {
	if h.copySending != nil {
		h.copySending(queue)
	}
	w := write()
	if h.copySent != nil {
		h.copySent(queue)
	}
	return w
}

func (p *port) hooks() *testHooks {
	if p.cfg.hooks == nil {
		return noHooks
	}
	return p.cfg.hooks
}
