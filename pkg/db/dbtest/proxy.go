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
}

// NewProxy starts a proxy to the test database, closed when t ends.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	u, err := url.Parse(BaseURL())
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{lis: lis, target: u.Host, conns: map[net.Conn]struct{}{}}
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
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
	}
	wg.Add(2)
	go pipe(server, client)
	go pipe(client, server)
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}
