package dbtest

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db"
)

// Proxy is a TCP proxy between a test's pool and Postgres that the test can cut: Cut resets
// every connection through it and refuses new ones until Restore, as a database restart or a
// network partition would. Only the test's own connections pass through it, so cutting them
// touches nobody else's.
type Proxy struct {
	lis    net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	// doomed are the client sides of the connections DropOnNextWrite marked.
	doomed map[net.Conn]bool
}

// NewProxy starts a proxy to the test database, closed when t ends.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	u, err := url.Parse(BaseURL())
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{lis: lis, target: u.Host, conns: map[net.Conn]struct{}{}, doomed: map[net.Conn]bool{}}
	go p.accept()
	t.Cleanup(func() {
		_ = lis.Close()
		p.Cut()
	})
	return p
}

// URL returns u (a database URL) pointed at the proxy.
func (p *Proxy) URL(t testing.TB, u string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	parsed.Host = p.lis.Addr().String()
	return parsed.String()
}

// Pool opens a pool on the schema through the proxy, closed when t ends.
func (p *Proxy) Pool(t testing.TB, s *Schema, opts ...db.Option) *pgxpool.Pool {
	t.Helper()
	pool, err := db.Open(context.Background(), p.URL(t, s.URL), opts...)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Cut resets every connection through the proxy and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as from a server that went away
		}
		_ = c.Close()
		delete(p.conns, c)
	}
}

// DropOnNextWrite makes every connection open now die the moment its client next sends
// something: the bytes are not forwarded and both sides are closed, as when a backend dies just
// as a statement is sent. Connections opened later are not affected.
func (p *Proxy) DropOnNextWrite() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		p.doomed[c] = true
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *Proxy) accept() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		if tc, ok := client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = client.Close()
		return
	}
	p.mu.Unlock()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		_ = client.Close()
		_ = server.Close()
		return
	}
	p.conns[client] = struct{}{}
	p.conns[server] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // client to server, watching for DropOnNextWrite
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				p.mu.Lock()
				doomed := p.doomed[client]
				p.mu.Unlock()
				if doomed {
					break
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = server.Close()
		_ = client.Close()
	}()
	go func() {
		defer wg.Done()
		_, _ = io.Copy(client, server)
		_ = client.Close()
		_ = server.Close()
	}()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	delete(p.doomed, client)
	p.mu.Unlock()
}
