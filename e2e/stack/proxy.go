package stack

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is the stack's stand-in for a load balancer in front of a program's replicas (a
// Kubernetes Service, an L4 balancer): it accepts TCP connections on one address and forwards
// each to the next replica that accepts a connection, round robin. A replica that dies takes its
// connections with it; the clients reconnect and land on a live one — as in production, where
// the services' clients dial one address per service.
type proxy struct {
	ln       net.Listener
	backends []string
	next     atomic.Uint64
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

func newProxy(addr string, backends []string) (*proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // a transient accept error (e.g. EMFILE): try again
			continue
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.forward(c) }()
	}
}

// forward pipes c to the first backend, from the next in turn, that accepts a connection; c is
// closed when none does, as a balancer with no healthy backend would.
func (p *proxy) forward(c net.Conn) {
	start := p.next.Add(1)
	var b net.Conn
	for i := range p.backends {
		addr := p.backends[(int(start)+i)%len(p.backends)]
		var err error
		if b, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			break
		}
	}
	if b == nil {
		_ = c.Close()
		return
	}
	if !p.track(c, b) {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(b, c)
	go pipe(c, b)
	<-done // one side ended: end both, as the connection is gone
	_ = c.Close()
	_ = b.Close()
	<-done
	p.untrack(c, b)
}

func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// Close stops accepting and ends every forwarded connection.
func (p *proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
