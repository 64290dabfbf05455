package stomp

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors a [Conn] reports. Test them with errors.Is; an ERROR frame is a [*ServerError] (errors.As).
var (
	// ErrClosed: the connection was closed by [Conn.Close].
	ErrClosed = errors.New("stomp: connection closed")
	// ErrHeartbeatTimeout: nothing arrived from the broker within three negotiated heart-beat
	// intervals.
	ErrHeartbeatTimeout = errors.New("stomp: broker silent beyond the heart-beat timeout")
	// ErrOutcomeUnknown wraps the error of a request whose RECEIPT never came (the context ended or
	// the connection died after the frame may have been written): the broker may or may not have
	// acted on it. A caller must treat the frame as possibly applied and possibly not.
	ErrOutcomeUnknown = errors.New("stomp: outcome unknown, no receipt")
)

// ServerError is an ERROR frame from the broker. STOMP has the broker close the connection after
// one, so the connection's [Conn.Err] then wraps it too.
type ServerError struct {
	Message   string // the message header: a short description
	ReceiptID string // the receipt-id header: the request it answers, if the broker said
	Frame     *Frame // the whole frame; its body is the broker's detail (a Java trace on ActiveMQ)
}

func (e *ServerError) Error() string {
	return "stomp: broker ERROR: " + truncate(e.Message)
}

// AckMode is a subscription's ack header.
type AckMode string

// The acknowledgement modes of STOMP 1.2.
const (
	AckAuto             AckMode = "auto"
	AckClient           AckMode = "client" // cumulative: an ACK settles every earlier message too
	AckClientIndividual AckMode = "client-individual"
)

// Option tunes [Dial].
type Option func(*options)

type options struct {
	send, recv time.Duration
	tls        *tls.Config
	dial       func(ctx context.Context, network, addr string) (net.Conn, error)
}

// WithDialer sets how the TCP connection is made (default a plain net.Dialer). The message port's
// tests wrap the socket to cut it or withhold what the broker sends, as a network fault would.
func WithDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(o *options) { o.dial = dial }
}

// WithHeartBeat asks for heart-beats: this client sends one at least every send, and wants one
// from the broker at least every recv (0 turns a direction off). The broker may ask for a longer
// interval; the larger of the two wins, as STOMP 1.2 negotiates. A connection that hears nothing
// for three receive intervals is declared dead ([ErrHeartbeatTimeout]). Default 10 s both ways.
func WithHeartBeat(send, recv time.Duration) Option {
	return func(o *options) { o.send, o.recv = max(send, 0), max(recv, 0) }
}

// WithTLS sets the TLS configuration of a stomp+ssl:// URL (default: the system's roots, the
// URL's host as the server name).
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// writeTimeout bounds one frame's write; a write that times out ends the connection, since part
// of the frame may be on the wire.
const writeTimeout = 30 * time.Second

// generations numbers connections across the process, so a delivery can name the connection it
// came from even after a reconnect produced a new one.
var generations atomic.Uint64

// Conn is one STOMP 1.2 connection. Its methods are safe for concurrent use: one goroutine reads
// (RECEIPT, MESSAGE, ERROR, heart-beats) and writes are serialized. When the connection ends —
// [Conn.Close], an ERROR frame, a socket error or a heart-beat timeout — [Conn.Done] is closed,
// [Conn.Err] says why, every waiting request returns (wrapping [ErrOutcomeUnknown] where a frame
// may have reached the broker), and every subscription's channel is closed.
type Conn struct {
	nc         net.Conn
	generation uint64
	version    string
	server     string
	session    string
	sendEvery  time.Duration
	recvEvery  time.Duration

	wmu       sync.Mutex
	wbuf      []byte
	lastWrite atomic.Int64 // unix nanoseconds

	mu       sync.Mutex
	receipts map[string]chan error
	subs     map[string]*Subscription
	err      error
	closing  bool

	ids        atomic.Uint64
	done       chan struct{}
	readerDone chan struct{}
	beatDone   chan struct{}
}

// Dial connects to stomp://[login:passcode@]host[:port][/vhost] (stomp+ssl:// for TLS; port 61613
// by default) and completes the CONNECT handshake for STOMP 1.2 within ctx.
func Dial(ctx context.Context, rawURL string, opts ...Option) (*Conn, error) {
	o := options{send: 10 * time.Second, recv: 10 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("stomp: parse URL: %w", redactURLError(err))
	}
	if u.Scheme != "stomp" && u.Scheme != "stomp+ssl" {
		return nil, fmt.Errorf("stomp: URL scheme %q: want stomp or stomp+ssl", u.Scheme)
	}
	if u.Hostname() == "" {
		return nil, errors.New("stomp: URL has no host")
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "61613")
	}
	dial := o.dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("stomp: dial %s: %w", addr, err)
	}
	if u.Scheme == "stomp+ssl" {
		cfg := cmp.Or(o.tls.Clone(), &tls.Config{MinVersion: tls.VersionTLS12})
		cfg.ServerName = cmp.Or(cfg.ServerName, u.Hostname())
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("stomp: TLS handshake with %s: %w", addr, err)
		}
		nc = tc
	}
	// CONNECT's host header, the broker's virtual host: the URL's path without its slash, else
	// its host name.
	host := cmp.Or(strings.TrimPrefix(u.Path, "/"), u.Hostname())
	c := &Conn{
		nc:         nc,
		generation: generations.Add(1),
		receipts:   make(map[string]chan error),
		subs:       make(map[string]*Subscription),
		done:       make(chan struct{}),
		readerDone: make(chan struct{}),
		beatDone:   make(chan struct{}),
	}
	dec, err := c.handshake(ctx, u, host, o)
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	go c.readLoop(dec)
	go c.beatLoop()
	return c, nil
}

func (c *Conn) handshake(ctx context.Context, u *url.URL, host string, o options) (*Decoder, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(30 * time.Second)
	}
	_ = c.nc.SetDeadline(deadline)
	// A cancelled ctx interrupts the handshake's reads and writes by a deadline in the past.
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	f := &Frame{Command: "CONNECT", Headers: []Header{
		{"accept-version", "1.2"},
		{"host", host},
		{"heart-beat", strconv.FormatInt(o.send.Milliseconds(), 10) + "," + strconv.FormatInt(o.recv.Milliseconds(), 10)},
	}}
	if u.User != nil {
		pass, _ := u.User.Password()
		f.Headers = append(f.Headers, Header{"login", u.User.Username()}, Header{"passcode", pass})
	}
	buf, err := f.Append(nil)
	if err != nil {
		return nil, fmt.Errorf("stomp: CONNECT: %w", err)
	}
	if _, err := c.nc.Write(buf); err != nil {
		return nil, fmt.Errorf("stomp: write CONNECT: %w", ctxErr(ctx, err))
	}
	rd := &deadlineReader{nc: c.nc}
	dec := NewDecoder(rd, DefaultLimits)
	reply, err := dec.Decode()
	if err != nil {
		return nil, fmt.Errorf("stomp: read CONNECTED: %w", ctxErr(ctx, err))
	}
	switch reply.Command {
	case "CONNECTED":
	case "ERROR":
		return nil, fmt.Errorf("stomp: CONNECT refused: %w", serverError(reply))
	default:
		return nil, fmt.Errorf("stomp: %w: %s in answer to CONNECT", ErrMalformed, reply.Command)
	}
	c.version = reply.Value("version")
	if c.version != "1.2" {
		return nil, fmt.Errorf("stomp: broker speaks version %q, not 1.2", c.version)
	}
	c.server, c.session = reply.Value("server"), reply.Value("session")
	sx, sy := parseHeartBeat(reply.Value("heart-beat"))
	c.sendEvery = negotiate(o.send, sy)
	c.recvEvery = negotiate(o.recv, sx)
	if !stop() {
		return nil, fmt.Errorf("stomp: CONNECT: %w", ctx.Err()) // its deadline may already be set
	}
	_ = c.nc.SetDeadline(time.Time{})
	rd.timeout = deadAfter * c.recvEvery
	c.lastWrite.Store(time.Now().UnixNano())
	return dec, nil
}

// deadAfter: a broker silent for this many receive intervals is dead. Not two: ActiveMQ Classic
// sends its first heart-beat two intervals after CONNECTED (measured), then one per interval.
const deadAfter = 3

// negotiate is STOMP 1.2's rule: off when either side says 0, else the larger interval.
func negotiate(mine, theirs time.Duration) time.Duration {
	if mine <= 0 || theirs <= 0 {
		return 0
	}
	return max(mine, theirs)
}

func parseHeartBeat(v string) (x, y time.Duration) {
	a, b, ok := strings.Cut(v, ",")
	if !ok {
		return 0, 0
	}
	ms := func(s string) time.Duration {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n < 0 || n > 1<<31 {
			return 0
		}
		return time.Duration(n) * time.Millisecond
	}
	return ms(a), ms(b)
}

// deadlineReader pushes the read deadline out before every read, so any byte from the broker —
// a frame or a heart-beat — proves it alive, and silence longer than timeout fails the read.
type deadlineReader struct {
	nc      net.Conn
	timeout time.Duration
}

func (r *deadlineReader) Read(p []byte) (int, error) {
	if r.timeout > 0 {
		_ = r.nc.SetReadDeadline(time.Now().Add(r.timeout))
	}
	return r.nc.Read(p)
}

// Generation identifies this connection within the process (increasing, never reused): a
// delivery carries the generation of the connection that received it, which is the only
// connection that can settle it.
func (c *Conn) Generation() uint64 { return c.generation }

// Done is closed when the connection has ended; [Conn.Err] then says why.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended ([ErrClosed] after Close), or nil while it is up.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Server is the broker's server header (e.g. "ActiveMQ/5.17.2").
func (c *Conn) Server() string { return c.server }

// Session is the broker's session header.
func (c *Conn) Session() string { return c.session }

// HeartBeat is the negotiated heart-beat: how often this client sends one, and how often the
// broker does (0: off).
func (c *Conn) HeartBeat() (send, recv time.Duration) { return c.sendEvery, c.recvEvery }

func (c *Conn) nextID(prefix string) string {
	return prefix + strconv.FormatUint(c.ids.Add(1), 10)
}

// Write sends one frame without waiting for anything (no receipt is added). A frame the codec
// refuses is an [ErrMalformed] error and nothing is written.
func (c *Conn) Write(f *Frame) error {
	_, err := c.write(f)
	return err
}

// write says whether any of the frame may have reached the socket.
func (c *Conn) write(f *Frame) (tried bool, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.Err(); err != nil {
		return false, err
	}
	buf, err := f.Append(c.wbuf[:0])
	if err != nil {
		return false, err
	}
	if cap(buf) <= 64<<10 {
		c.wbuf = buf // keep a modest buffer for the next frame
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err = c.nc.Write(buf)
	c.lastWrite.Store(time.Now().UnixNano())
	if err != nil {
		err = fmt.Errorf("stomp: write %s: %w", f.Command, err)
		c.fail(err)
		return true, err
	}
	return true, nil
}

// Request sends f with a receipt header of its own and waits for the broker's RECEIPT. It returns
// nil once the broker has answered; a [*ServerError] if the broker answered it with an ERROR; an
// error wrapping [ErrOutcomeUnknown] if ctx ended or the connection died after the frame may have
// been written; any other error means the frame was not sent. f gets the receipt header appended.
func (c *Conn) Request(ctx context.Context, f *Frame) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("stomp: %s not sent: %w", f.Command, err)
	}
	return c.Post(f).Wait(ctx)
}

// Receipt is a request written and awaiting the broker's RECEIPT (see [Conn.Post]).
type Receipt struct {
	c       *Conn
	id      string
	command string
	ch      chan error
	err     error // set when the frame was not written (or may have been, wrapped in ErrOutcomeUnknown)
}

// Post writes f with a receipt header of its own and returns without waiting: [Receipt.Wait]
// waits. Frames posted one after another from one goroutine reach the broker in that order, so a
// caller can pipeline many and await their receipts after. f gets the receipt header appended.
func (c *Conn) Post(f *Frame) *Receipt {
	id := c.nextID("r")
	r := &Receipt{c: c, id: id, command: f.Command, ch: make(chan error, 1)}
	f.Headers = append(f.Headers, Header{"receipt", id})
	c.mu.Lock()
	if c.err != nil {
		r.err = c.err
		c.mu.Unlock()
		return r
	}
	c.receipts[id] = r.ch
	c.mu.Unlock()
	if tried, err := c.write(f); err != nil {
		c.forget(id)
		if !tried {
			r.err = err
		} else {
			r.err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
		}
	}
	return r
}

// Wait waits for the receipt: errors are as [Conn.Request]'s. Call it once.
func (r *Receipt) Wait(ctx context.Context) error {
	if r.err != nil {
		return r.err
	}
	select {
	case err := <-r.ch:
		return err
	case <-ctx.Done():
		r.c.forget(r.id)
		return fmt.Errorf("%w: %s: %w", ErrOutcomeUnknown, r.command, ctx.Err())
	}
}

func (c *Conn) forget(id string) {
	c.mu.Lock()
	delete(c.receipts, id)
	c.mu.Unlock()
}

// Send publishes body to dest and waits for the broker's RECEIPT: nil means the broker has the
// message. Errors are as [Conn.Request]'s: on one wrapping [ErrOutcomeUnknown] the message may or
// may not have been taken. headers (e.g. persistent:true, AMQ_SCHEDULED_DELAY, correlation-id)
// follow destination; content-length is added.
func (c *Conn) Send(ctx context.Context, dest string, headers []Header, body []byte) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("stomp: SEND not sent: %w", err)
	}
	return c.SendAsync(dest, headers, body).Wait(ctx)
}

// SendAsync is [Conn.Send] without the wait: it writes the SEND and returns its [Receipt].
func (c *Conn) SendAsync(dest string, headers []Header, body []byte) *Receipt {
	f := &Frame{Command: "SEND", Body: body}
	f.Headers = make([]Header, 0, len(headers)+3)
	f.Headers = append(f.Headers, Header{"destination", dest})
	f.Headers = append(f.Headers, headers...)
	f.Headers = append(f.Headers, Header{"content-length", strconv.Itoa(len(body))})
	return c.Post(f)
}

// Ack acknowledges the delivery whose ack header is ackID and waits for the RECEIPT. headers may
// carry a transaction. (For an ACK without a receipt, [Conn.Write] a frame.)
func (c *Conn) Ack(ctx context.Context, ackID string, headers ...Header) error {
	return c.Request(ctx, &Frame{Command: "ACK", Headers: append([]Header{{"id", ackID}}, headers...)})
}

// Nack refuses the delivery whose ack header is ackID and waits for the RECEIPT. What the broker
// then does with the message is its own (see docs/decisions.md, "STOMP on ActiveMQ Classic").
func (c *Conn) Nack(ctx context.Context, ackID string, headers ...Header) error {
	return c.Request(ctx, &Frame{Command: "NACK", Headers: append([]Header{{"id", ackID}}, headers...)})
}

// Begin starts the transaction tx; Commit and Abort end it. Each waits for its RECEIPT.
func (c *Conn) Begin(ctx context.Context, tx string) error {
	return c.Request(ctx, &Frame{Command: "BEGIN", Headers: []Header{{"transaction", tx}}})
}

// Commit commits the transaction tx.
func (c *Conn) Commit(ctx context.Context, tx string) error {
	return c.Request(ctx, &Frame{Command: "COMMIT", Headers: []Header{{"transaction", tx}}})
}

// Abort rolls back the transaction tx.
func (c *Conn) Abort(ctx context.Context, tx string) error {
	return c.Request(ctx, &Frame{Command: "ABORT", Headers: []Header{{"transaction", tx}}})
}

// Close sends DISCONNECT, waits for its RECEIPT within ctx, and closes the socket; it returns when
// the connection's goroutines have ended. It returns nil when the broker confirmed the
// DISCONNECT (every earlier frame was then processed), else why not. Closing a closed or failed
// connection returns nil.
func (c *Conn) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.err != nil || c.closing {
		c.mu.Unlock()
		c.wait()
		return nil
	}
	c.closing = true
	c.mu.Unlock()
	err := c.Request(ctx, &Frame{Command: "DISCONNECT"})
	c.fail(ErrClosed)
	c.wait()
	if err != nil {
		return fmt.Errorf("stomp: DISCONNECT: %w", err)
	}
	return nil
}

func (c *Conn) wait() {
	<-c.readerDone
	<-c.beatDone
}

// fail ends the connection once, with err as the reason: the socket is closed, waiting requests
// return, subscriptions end.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	if c.closing && !errors.Is(err, ErrClosed) {
		// The broker closes its end after the DISCONNECT's RECEIPT: that EOF is the close.
		err = ErrClosed
	}
	c.err = err
	receipts, subs := c.receipts, c.subs
	c.receipts, c.subs = nil, nil
	c.mu.Unlock()
	close(c.done)
	_ = c.nc.Close()
	for _, ch := range receipts {
		ch <- fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	for _, s := range subs {
		s.end()
	}
}

func (c *Conn) readLoop(dec *Decoder) {
	defer close(c.readerDone)
	for {
		f, err := dec.Decode()
		if err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				err = fmt.Errorf("%w (%s)", ErrHeartbeatTimeout, deadAfter*c.recvEvery)
			case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
				err = fmt.Errorf("stomp: connection closed by the broker: %w", err)
			default:
				err = fmt.Errorf("stomp: read: %w", err)
			}
			c.fail(err)
			return
		}
		switch f.Command {
		case "MESSAGE":
			c.dispatch(f)
		case "RECEIPT":
			c.answer(f.Value("receipt-id"), nil)
		case "ERROR":
			se := serverError(f)
			if se.ReceiptID != "" {
				c.answer(se.ReceiptID, se)
			}
			c.fail(fmt.Errorf("stomp: connection closed after an ERROR frame: %w", se))
			return
		default:
			c.fail(fmt.Errorf("stomp: %w: unexpected %s from the broker", ErrMalformed, f.Command))
			return
		}
	}
}

func (c *Conn) answer(id string, err error) {
	c.mu.Lock()
	ch, ok := c.receipts[id]
	delete(c.receipts, id)
	c.mu.Unlock()
	if ok {
		ch <- err
	}
}

func serverError(f *Frame) *ServerError {
	return &ServerError{Message: f.Value("message"), ReceiptID: f.Value("receipt-id"), Frame: f}
}

// beatLoop sends a heart-beat (an EOL) whenever nothing was written for the send interval.
func (c *Conn) beatLoop() {
	defer close(c.beatDone)
	if c.sendEvery <= 0 {
		<-c.done
		return
	}
	t := time.NewTicker(c.sendEvery / 2)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			if time.Since(time.Unix(0, c.lastWrite.Load())) < c.sendEvery/2 {
				continue
			}
			if err := c.writeBeat(); err != nil {
				return
			}
		}
	}
}

func (c *Conn) writeBeat() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := c.nc.Write([]byte{'\n'})
	c.lastWrite.Store(time.Now().UnixNano())
	if err != nil {
		c.fail(fmt.Errorf("stomp: write heart-beat: %w", err))
	}
	return err
}

// ctxErr prefers the context's error to the deadline error it caused.
// The socket's deadline is ctx's, so the read can fail a moment before ctx.Err is set.
func ctxErr(ctx context.Context, err error) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	if e := ctx.Err(); e != nil {
		return e
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return err
}

// redactURLError keeps a passcode out of an error: url.Error quotes the whole URL.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
