package stomp

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDecode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		lim  Limits
		want []*Frame // frames in order, then io.EOF
		err  error    // instead of io.EOF after want
	}{
		{
			name: "message with escaped headers and a body up to the NUL",
			in:   "MESSAGE\nsubscription:0\nmessage-id:ID\\cbox-1\\c2\nk\\\\ey:line1\\nline2\\r\n\nhello\x00",
			want: []*Frame{{Command: "MESSAGE", Headers: []Header{{"subscription", "0"}, {"message-id", "ID:box-1:2"}, {"k\\ey", "line1\nline2\r"}}, Body: []byte("hello")}},
		},
		{
			name: "CRLF line ends and heart-beats between frames",
			in:   "\r\n\nRECEIPT\r\nreceipt-id:7\r\n\r\n\x00\n\r\n\nRECEIPT\nreceipt-id:8\n\n\x00\n",
			want: []*Frame{
				{Command: "RECEIPT", Headers: []Header{{"receipt-id", "7"}}},
				{Command: "RECEIPT", Headers: []Header{{"receipt-id", "8"}}},
			},
		},
		{
			name: "content-length body carries NULs",
			in:   "SEND\ndestination:/queue/a\ncontent-length:5\n\na\x00b\x00c\x00",
			want: []*Frame{{Command: "SEND", Headers: []Header{{"destination", "/queue/a"}, {"content-length", "5"}}, Body: []byte("a\x00b\x00c")}},
		},
		{
			name: "repeated header: both kept in order, Get returns the first",
			in:   "MESSAGE\nfoo:first\nfoo:second\n\n\x00",
			want: []*Frame{{Command: "MESSAGE", Headers: []Header{{"foo", "first"}, {"foo", "second"}}}},
		},
		{
			name: "CONNECTED headers are not unescaped",
			in:   "CONNECTED\nserver:ActiveMQ/5.17.2\nsession:a\\cb:c\n\n\x00",
			want: []*Frame{{Command: "CONNECTED", Headers: []Header{{"server", "ActiveMQ/5.17.2"}, {"session", "a\\cb:c"}}}},
		},
		{
			name: "a value may hold a colon after the first",
			in:   "MESSAGE\ndestination:/queue/a:b\n\n\x00",
			want: []*Frame{{Command: "MESSAGE", Headers: []Header{{"destination", "/queue/a:b"}}}},
		},
		{name: "only heart-beats", in: "\n\r\n\n"},
		{name: "empty stream", in: ""},
		{name: "lower-case command", in: "send\n\n\x00", err: ErrMalformed},
		{name: "undefined escape", in: "MESSAGE\nk:a\\tb\n\n\x00", err: ErrMalformed},
		{name: "trailing backslash", in: "MESSAGE\nk:a\\\n\n\x00", err: ErrMalformed},
		{name: "header without colon", in: "MESSAGE\nnocolon\n\n\x00", err: ErrMalformed},
		{name: "empty header name", in: "MESSAGE\n:v\n\n\x00", err: ErrMalformed},
		{name: "bad content-length", in: "SEND\ncontent-length:+3\n\nabc\x00", err: ErrMalformed},
		{name: "no NUL after content-length body", in: "SEND\ncontent-length:3\n\nabcd\x00", err: ErrMalformed},
		{name: "CR without LF between frames", in: "\rSEND\n\n\x00", err: ErrMalformed},
		{name: "cut in the headers", in: "MESSAGE\nk:v", err: io.ErrUnexpectedEOF},
		{name: "cut in the body", in: "MESSAGE\n\nbody", err: io.ErrUnexpectedEOF},
		{name: "cut in a content-length body", in: "MESSAGE\ncontent-length:10\n\nbody", err: io.ErrUnexpectedEOF},
		{name: "too many headers", in: "MESSAGE\na:1\nb:2\nc:3\n\n\x00", lim: Limits{MaxHeaders: 2}, err: ErrTooLarge},
		{name: "header line too long", in: "MESSAGE\nk:" + strings.Repeat("v", 100) + "\n\n\x00", lim: Limits{MaxHeaderLine: 32}, err: ErrTooLarge},
		{name: "content-length above the body limit", in: "SEND\ncontent-length:1000000000\n\n", lim: Limits{MaxBody: 1024}, err: ErrTooLarge},
		{name: "body without content-length above the limit", in: "SEND\n\n" + strings.Repeat("x", 2048) + "\x00", lim: Limits{MaxBody: 1024, MaxHeaderLine: 64}, err: ErrTooLarge},
		{
			name: "body at the limit is fine",
			in:   "SEND\n\n" + strings.Repeat("x", 100) + "\x00",
			lim:  Limits{MaxBody: 100, MaxHeaderLine: 16},
			want: []*Frame{{Command: "SEND", Body: []byte(strings.Repeat("x", 100))}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := NewDecoder(strings.NewReader(tt.in), tt.lim)
			for i, want := range tt.want {
				got, err := d.Decode()
				require.NoError(t, err, "frame %d", i)
				requireFrameEqual(t, want, got)
			}
			_, err := d.Decode()
			want := tt.err
			if want == nil {
				want = io.EOF
			}
			require.ErrorIs(t, err, want)
		})
	}
}

func TestFrameGet(t *testing.T) {
	t.Parallel()
	f := &Frame{Command: "MESSAGE", Headers: []Header{{"a", "1"}, {"a", "2"}, {"b", ""}}}
	v, ok := f.Get("a")
	require.True(t, ok)
	require.Equal(t, "1", v)
	v, ok = f.Get("b")
	require.True(t, ok)
	require.Empty(t, v)
	_, ok = f.Get("c")
	require.False(t, ok)
}

func TestEncode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		f    Frame
		want string
		err  bool
	}{
		{
			name: "escapes keys and values",
			f:    Frame{Command: "SEND", Headers: []Header{{"a:b", "x\\y\r\nz"}}, Body: []byte("hi")},
			want: "SEND\na\\cb:x\\\\y\\r\\nz\n\nhi\x00",
		},
		{
			name: "CONNECT is written raw",
			f:    Frame{Command: "CONNECT", Headers: []Header{{"passcode", "p:w\\d"}}},
			want: "CONNECT\npasscode:p:w\\d\n\n\x00",
		},
		{
			name: "content-length body with NULs",
			f:    Frame{Command: "SEND", Headers: []Header{{"content-length", "3"}}, Body: []byte{0, 1, 0}},
			want: "SEND\ncontent-length:3\n\n\x00\x01\x00\x00",
		},
		{name: "empty command", f: Frame{}, err: true},
		{name: "command with a newline", f: Frame{Command: "SEND\nX"}, err: true},
		{name: "empty header name", f: Frame{Command: "SEND", Headers: []Header{{"", "v"}}}, err: true},
		{name: "NUL in a header", f: Frame{Command: "SEND", Headers: []Header{{"k", "a\x00"}}}, err: true},
		{name: "newline in a CONNECT header", f: Frame{Command: "CONNECT", Headers: []Header{{"login", "a\nb"}}}, err: true},
		{name: "colon in a CONNECT header name", f: Frame{Command: "CONNECT", Headers: []Header{{"a:b", "v"}}}, err: true},
		{name: "NUL body without content-length", f: Frame{Command: "SEND", Body: []byte{'a', 0}}, err: true},
		{name: "content-length not the body's", f: Frame{Command: "SEND", Headers: []Header{{"content-length", "2"}}, Body: []byte("abc")}, err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.f.Append([]byte("keep"))
			if tt.err {
				require.ErrorIs(t, err, ErrMalformed)
				require.Equal(t, "keep", string(got), "a refused frame leaves dst as it was")
				return
			}
			require.NoError(t, err)
			require.Equal(t, "keep"+tt.want, string(got))
			back, err := NewDecoder(bytes.NewReader(got[len("keep"):]), Limits{}).Decode()
			require.NoError(t, err)
			requireFrameEqual(t, &tt.f, back)
		})
	}
}

func requireFrameEqual(t *testing.T, want, got *Frame) {
	t.Helper()
	require.True(t, framesEqual(want, got), "want %+v\n got %+v", want, got)
}

// framesEqual treats nil and empty alike: the decoder does not tell them apart.
func framesEqual(a, b *Frame) bool {
	if a.Command != b.Command || len(a.Headers) != len(b.Headers) || !bytes.Equal(a.Body, b.Body) {
		return false
	}
	for i := range a.Headers {
		if a.Headers[i] != b.Headers[i] {
			return false
		}
	}
	return true
}

// FuzzDecode: the decoder never panics or overruns its limits on arbitrary input, and every frame
// the encoder accepts — one the decoder produced, or one built from the input's pieces — decodes
// back to itself.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		"MESSAGE\nsubscription:0\nmessage-id:ID\\cx\n\nhello\x00\n",
		"CONNECTED\r\nversion:1.2\r\nheart-beat:0,0\r\n\r\n\x00",
		"SEND\ncontent-length:3\n\na\x00b\x00",
		"ERROR\nmessage:bad\\nthing\n\n\x00",
		"\n\n\r\nRECEIPT\nreceipt-id:1\n\n\x00",
		"SEND\xffdestination\xff/queue/a:b\xffbody\x00x",
	} {
		f.Add([]byte(s))
	}
	lim := Limits{MaxHeaders: 16, MaxHeaderLine: 256, MaxBody: 4096}
	f.Fuzz(func(t *testing.T, data []byte) {
		d := NewDecoder(bytes.NewReader(data), lim)
		for i := 0; i < 64; i++ {
			fr, err := d.Decode()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) &&
					!errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTooLarge) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				break
			}
			if len(fr.Headers) > lim.MaxHeaders || len(fr.Body) > lim.MaxBody {
				t.Fatalf("frame beyond limits: %d headers, %d bytes", len(fr.Headers), len(fr.Body))
			}
			roundTrip(t, fr)
		}
		// The input's pieces as a frame: command, then key/value pairs, then the body, split at 0xff.
		parts := bytes.Split(data, []byte{0xff})
		fr := &Frame{Command: string(parts[0])}
		rest := parts[1:]
		for len(rest) > 2 {
			fr.Headers = append(fr.Headers, Header{Key: string(rest[0]), Value: string(rest[1])})
			rest = rest[2:]
		}
		if len(rest) > 0 {
			fr.Body = rest[len(rest)-1]
		}
		roundTrip(t, fr)
	})
}

func roundTrip(t *testing.T, fr *Frame) {
	t.Helper()
	enc, err := fr.Append(nil)
	if err != nil {
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("encode: unexpected error kind: %v", err)
		}
		return
	}
	back, err := NewDecoder(bytes.NewReader(enc), Limits{MaxHeaders: 1 << 10, MaxHeaderLine: 1 << 20, MaxBody: 1 << 20}).Decode()
	if err != nil {
		t.Fatalf("decode(encode(%q)): %v", enc, err)
	}
	if !framesEqual(fr, back) {
		t.Fatalf("round trip: %+v became %+v", fr, back)
	}
}

func TestHeartBeatNegotiation(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tt := range []struct {
		header       string
		send, recv   time.Duration // asked for
		wSend, wRecv time.Duration
	}{
		{"1000,1000", 500 * ms, 500 * ms, 1000 * ms, 1000 * ms}, // the larger wins
		{"100,2000", 500 * ms, 500 * ms, 2000 * ms, 500 * ms},
		{"0,0", 500 * ms, 500 * ms, 0, 0},  // the broker will not
		{"1000,1000", 0, 0, 0, 0},          // we will not
		{"", 500 * ms, 500 * ms, 0, 0},     // no header: none
		{"x,-5", 500 * ms, 500 * ms, 0, 0}, // garbage: none
		{"1000", 500 * ms, 500 * ms, 0, 0}, // one number: none
		{"300, 400", 100 * ms, 100 * ms, 400 * ms, 300 * ms},
	} {
		sx, sy := parseHeartBeat(tt.header)
		require.Equal(t, tt.wSend, negotiate(tt.send, sy), "send, heart-beat:%s", tt.header)
		require.Equal(t, tt.wRecv, negotiate(tt.recv, sx), "receive, heart-beat:%s", tt.header)
	}
}
