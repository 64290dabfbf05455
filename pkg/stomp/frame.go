package stomp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Header is one header line of a frame. A frame keeps its headers in order because STOMP lets a
// header repeat and says the first occurrence wins.
type Header struct {
	Key, Value string
}

// Frame is one STOMP frame: a command, ordered headers and a body.
//
// The codec never adds or removes a header: content-length is written only when the frame has one
// (the client adds it to every frame it sends), so decode(encode(f)) == f for every frame the
// encoder accepts.
type Frame struct {
	Command string
	Headers []Header
	Body    []byte
}

// Get returns the value of the first header named key, as STOMP 1.2 says of repeated headers.
func (f *Frame) Get(key string) (string, bool) { return header(f.Headers, key) }

// Value is Get without the presence flag.
func (f *Frame) Value(key string) string {
	v, _ := f.Get(key)
	return v
}

// ErrMalformed is wrapped by every error about a frame that breaks STOMP 1.2 (while encoding or
// decoding); ErrTooLarge by every error about a frame beyond the [Limits].
var (
	ErrMalformed = errors.New("stomp: malformed frame")
	ErrTooLarge  = errors.New("stomp: frame beyond limits")
)

// Limits bound what the decoder reads, so a broken or hostile peer costs an error, never an
// unbounded allocation. Zero fields take the defaults of [DefaultLimits].
type Limits struct {
	MaxHeaders    int // headers per frame
	MaxHeaderLine int // bytes of the command line or of one header line, escapes included
	MaxBody       int // bytes of one body
}

// DefaultLimits are generous for the port's messages (a JSON payload and a dozen headers).
var DefaultLimits = Limits{MaxHeaders: 64, MaxHeaderLine: 16 << 10, MaxBody: 8 << 20}

func (l Limits) withDefaults() Limits {
	if l.MaxHeaders <= 0 {
		l.MaxHeaders = DefaultLimits.MaxHeaders
	}
	if l.MaxHeaderLine <= 0 {
		l.MaxHeaderLine = DefaultLimits.MaxHeaderLine
	}
	if l.MaxBody < 0 {
		l.MaxBody = 0
	} else if l.MaxBody == 0 {
		l.MaxBody = DefaultLimits.MaxBody
	}
	return l
}

const maxCommand = 32

// validCommand: the decoder and the encoder accept the same commands (upper-case letters), so a
// round trip cannot fail on one side only.
func validCommand(c string) bool {
	if c == "" || len(c) > maxCommand {
		return false
	}
	for i := 0; i < len(c); i++ {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

// rawHeaders: STOMP 1.2 leaves the headers of CONNECT (and its alias STOMP) and CONNECTED
// unescaped, for 1.0 compatibility.
func rawHeaders(command string) bool {
	return command == "CONNECT" || command == "STOMP" || command == "CONNECTED"
}

var escaper = strings.NewReplacer("\\", `\\`, "\r", `\r`, "\n", `\n`, ":", `\c`)

// Append encodes f onto dst. It refuses (ErrMalformed) what STOMP 1.2 cannot carry: a command
// that is not upper-case letters, an empty header name, a NUL in a header, an unescaped frame's
// header with a CR or LF (or a colon in its name), a content-length that is not the body's length,
// and a body with a NUL but no content-length.
func (f *Frame) Append(dst []byte) ([]byte, error) {
	start := len(dst)
	fail := func(format string, a ...any) ([]byte, error) {
		return dst[:start], fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, a...)...)
	}
	if !validCommand(f.Command) {
		return fail("command %q", f.Command)
	}
	raw := rawHeaders(f.Command)
	lengthSeen := false
	dst = append(dst, f.Command...)
	dst = append(dst, '\n')
	for _, h := range f.Headers {
		if h.Key == "" {
			return fail("empty header name")
		}
		if strings.IndexByte(h.Key, 0) >= 0 || strings.IndexByte(h.Value, 0) >= 0 {
			return fail("NUL in header %q", h.Key)
		}
		if raw {
			if strings.ContainsAny(h.Key, "\r\n:") || strings.ContainsAny(h.Value, "\r\n") {
				return fail("%s header %q: an unescaped frame cannot carry CR, LF, or a colon in a name", f.Command, h.Key)
			}
			dst = append(dst, h.Key...)
			dst = append(dst, ':')
			dst = append(dst, h.Value...)
		} else {
			dst = append(dst, escaper.Replace(h.Key)...)
			dst = append(dst, ':')
			dst = append(dst, escaper.Replace(h.Value)...)
		}
		dst = append(dst, '\n')
		if h.Key == "content-length" && !lengthSeen {
			lengthSeen = true
			if n, ok := parseLength(h.Value); !ok || n != len(f.Body) {
				return fail("content-length %q for a body of %d bytes", h.Value, len(f.Body))
			}
		}
	}
	if !lengthSeen && bytesIndexNUL(f.Body) >= 0 {
		return fail("a body with a NUL needs a content-length header")
	}
	dst = append(dst, '\n')
	dst = append(dst, f.Body...)
	dst = append(dst, 0)
	return dst, nil
}

func bytesIndexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// parseLength accepts only decimal digits: strconv.Atoi alone would take "+5" or "-0".
func parseLength(s string) (int, bool) {
	if s == "" || len(s) > 10 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// Decoder reads frames from a stream, skipping the heart-beat EOLs between them.
type Decoder struct {
	r   *bufio.Reader
	lim Limits
}

// NewDecoder reads from r within lim (zero fields: [DefaultLimits]). Its buffer is one header
// line long, which is what bounds a line.
func NewDecoder(r io.Reader, lim Limits) *Decoder {
	lim = lim.withDefaults()
	return &Decoder{r: bufio.NewReaderSize(r, lim.MaxHeaderLine+2), lim: lim}
}

// Decode reads the next frame. Heart-beats (EOLs between frames) are skipped. At a clean end of
// stream between frames it returns io.EOF; in the middle of a frame io.ErrUnexpectedEOF; a frame
// that breaks STOMP 1.2 an error wrapping [ErrMalformed], one beyond the limits [ErrTooLarge].
// After an error the stream's position is undefined: the connection is done.
func (d *Decoder) Decode() (*Frame, error) {
	if err := d.skipEOLs(); err != nil {
		return nil, err
	}
	line, err := d.line()
	if err != nil {
		return nil, eofIsUnexpected(err)
	}
	if !validCommand(line) {
		return nil, fmt.Errorf("%w: command %q", ErrMalformed, truncate(line))
	}
	f := &Frame{Command: line}
	raw := rawHeaders(f.Command)
	length := -1
	for {
		line, err := d.line()
		if err != nil {
			return nil, eofIsUnexpected(err)
		}
		if line == "" {
			break
		}
		if len(f.Headers) == d.lim.MaxHeaders {
			return nil, fmt.Errorf("%w: more than %d headers", ErrTooLarge, d.lim.MaxHeaders)
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("%w: header line without a colon", ErrMalformed)
		}
		if strings.IndexByte(line, 0) >= 0 {
			return nil, fmt.Errorf("%w: NUL in a header line", ErrMalformed)
		}
		if !raw {
			if k, err = unescape(k); err != nil {
				return nil, err
			}
			if v, err = unescape(v); err != nil {
				return nil, err
			}
		}
		if k == "" {
			return nil, fmt.Errorf("%w: empty header name", ErrMalformed)
		}
		if k == "content-length" && length < 0 {
			n, ok := parseLength(v)
			if !ok {
				return nil, fmt.Errorf("%w: content-length %q", ErrMalformed, truncate(v))
			}
			if n > d.lim.MaxBody {
				return nil, fmt.Errorf("%w: content-length %d above %d", ErrTooLarge, n, d.lim.MaxBody)
			}
			length = n
		}
		f.Headers = append(f.Headers, Header{Key: k, Value: v})
	}
	if length >= 0 {
		f.Body = make([]byte, length)
		if _, err := io.ReadFull(d.r, f.Body); err != nil {
			return nil, eofIsUnexpected(err)
		}
		b, err := d.r.ReadByte()
		if err != nil {
			return nil, eofIsUnexpected(err)
		}
		if b != 0 {
			return nil, fmt.Errorf("%w: no NUL after a body of content-length %d", ErrMalformed, length)
		}
	} else {
		for {
			chunk, err := d.r.ReadSlice(0)
			n := len(chunk)
			if err == nil {
				n-- // the NUL
			}
			if len(f.Body)+n > d.lim.MaxBody {
				return nil, fmt.Errorf("%w: body above %d bytes", ErrTooLarge, d.lim.MaxBody)
			}
			f.Body = append(f.Body, chunk[:n]...)
			if err == nil {
				break
			}
			if !errors.Is(err, bufio.ErrBufferFull) {
				return nil, eofIsUnexpected(err)
			}
		}
	}
	return f, nil
}

// skipEOLs consumes heart-beats: LF or CR LF.
func (d *Decoder) skipEOLs() error {
	for {
		b, err := d.r.Peek(1)
		if err != nil {
			return err // io.EOF here is a clean end
		}
		switch b[0] {
		case '\n':
			_, _ = d.r.Discard(1)
		case '\r':
			b, err := d.r.Peek(2)
			if err != nil {
				return eofIsUnexpected(err)
			}
			if b[1] != '\n' {
				return fmt.Errorf("%w: CR without LF between frames", ErrMalformed)
			}
			_, _ = d.r.Discard(2)
		default:
			return nil
		}
	}
}

// line reads one line (without its LF or CR LF) of at most MaxHeaderLine bytes.
func (d *Decoder) line() (string, error) {
	b, err := d.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return "", fmt.Errorf("%w: a line longer than %d bytes", ErrTooLarge, d.lim.MaxHeaderLine)
		}
		return "", err
	}
	b = b[:len(b)-1]
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	if len(b) > d.lim.MaxHeaderLine {
		return "", fmt.Errorf("%w: a line longer than %d bytes", ErrTooLarge, d.lim.MaxHeaderLine)
	}
	return string(b), nil
}

// unescape undoes STOMP 1.2's header escaping; any other backslash sequence is an error, as the
// specification demands.
func unescape(s string) (string, error) {
	i := strings.IndexByte(s, '\\')
	if i < 0 {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	b.WriteString(s[:i])
	for ; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i == len(s) {
			return "", fmt.Errorf("%w: a header ends in a backslash", ErrMalformed)
		}
		switch s[i] {
		case 'r':
			b.WriteByte('\r')
		case 'n':
			b.WriteByte('\n')
		case 'c':
			b.WriteByte(':')
		case '\\':
			b.WriteByte('\\')
		default:
			return "", fmt.Errorf("%w: undefined escape \\%c in a header", ErrMalformed, s[i])
		}
	}
	return b.String(), nil
}

func eofIsUnexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// truncate keeps an error message short when it quotes what a peer sent.
func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
