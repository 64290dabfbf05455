package mq

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// STOMP headers are text, and a broker reads some of them itself. The port's header maps hold Go
// values (strings; int32 attempts; whatever an application put), so the STOMP provider writes
// every header as text, records in hdrSTOMPTypes which were not strings, and decodes them back
// before the shared rules or a handler see them.

// ErrSTOMPHeader is wrapped by every error about a header the STOMP provider cannot write: a
// name a broker would read as its own, or a value STOMP cannot carry.
var ErrSTOMPHeader = errors.New("mq: header not writable over STOMP")

// What a message may carry over STOMP: pkg/stomp's decoder refuses a frame beyond its limits
// (stomp.DefaultLimits: 64 headers, 16 KiB a header line, 8 MiB a body) by ending the connection,
// so a message past them would end every consumer's connection it reached and come back, again and
// again. The broker adds about a dozen headers to a delivery and the port up to five of its own:
// stompMaxHeaders leaves them room, and an application message leaves room besides for the
// bookkeeping headers its retry and dead-letter copies gain.
const (
	stompMaxHeaders    = 44
	stompMaxHeaderLine = 8 << 10
	stompMaxBody       = 8 << 20
)

// stompHeaderName is what an application header may be called over STOMP: header names a broker
// turns into message properties, without the characters STOMP escapes.
var stompHeaderName = regexp.MustCompile(`^[A-Za-z0-9_.\-]+$`)

// stompBrokerHeaders are the headers STOMP and ActiveMQ (Classic or Artemis) read or write
// themselves: an application may not set them (the broker would act on them: expires drops a
// message, type and priority change it), and they are not the handler's on delivery.
var stompBrokerHeaders = map[string]bool{
	"destination": true, "message-id": true, "subscription": true, "ack": true, "id": true,
	"content-length": true, "content-type": true, "receipt": true, "receipt-id": true,
	"transaction": true, "persistent": true, "priority": true, "expires": true, "timestamp": true,
	"redelivered": true, "correlation-id": true, "reply-to": true, "type": true,
	"original-destination": true, "browser": true, "selector": true, "login": true, "passcode": true,
}

// stompBrokerHeader reports a header name of the broker's or the port's own (case-insensitively:
// brokers differ in how they match them).
func stompBrokerHeader(k string) bool {
	l := strings.ToLower(k)
	if stompBrokerHeaders[l] {
		return true
	}
	for _, p := range []string{"jms", "amq_", "_amq_", "_hq_", "activemq.", "mq_"} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

// stompHeaders encodes a header map for a SEND: sorted by name (a frame's order is stable), every
// value as text, the types of the values that were not strings in hdrSTOMPTypes. Names and values
// are checked: an error names the header and wraps ErrSTOMPHeader; nothing is sent then.
func stompHeaders(h map[string]any) ([]stomp.Header, error) {
	if len(h) > stompMaxHeaders {
		return nil, fmt.Errorf("%d headers, over the %d a STOMP message of the port may carry: %w", len(h), stompMaxHeaders, ErrSTOMPHeader)
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]stomp.Header, 0, len(keys)+1)
	var types []string
	for _, k := range keys {
		if !stompHeaderName.MatchString(k) {
			return nil, fmt.Errorf("header %q: a STOMP header name is [A-Za-z0-9_.-]+: %w", k, ErrSTOMPHeader)
		}
		if stompBrokerHeader(k) {
			return nil, fmt.Errorf("header %q: the broker's or the port's own name: %w", k, ErrSTOMPHeader)
		}
		var v string
		switch x := h[k].(type) {
		case string:
			v = x
		case []byte:
			v = string(x)
		case bool:
			v = strconv.FormatBool(x)
			types = append(types, k+"=b")
		case int8, int16, int32, int64, int, uint8, uint16, uint32:
			n, _ := intHeader(h, k)
			v = strconv.FormatInt(n, 10)
			types = append(types, k+"=i")
		default:
			return nil, fmt.Errorf("header %q: a %T value (STOMP carries strings, integers and booleans): %w", k, x, ErrSTOMPHeader)
		}
		if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("header %q: the value is not UTF-8 text without NUL: %w", k, ErrSTOMPHeader)
		}
		if len(k)+1+2*len(v) > stompMaxHeaderLine { // escaping at most doubles a value
			return nil, fmt.Errorf("header %q: %d bytes, over the %d a STOMP header line of the port may take: %w", k, len(v), stompMaxHeaderLine, ErrSTOMPHeader)
		}
		out = append(out, stomp.Header{Key: k, Value: v})
	}
	if len(types) > 0 {
		out = append(out, stomp.Header{Key: hdrSTOMPTypes, Value: strings.Join(types, ",")})
	}
	return out, nil
}

// fromSTOMP decodes a delivery's headers into the port's map: the application's and the port's
// bookkeeping headers, typed again (integers as int32 when they fit, as the rules write them),
// without the broker's and the port's internal STOMP headers. The first of a repeated header wins.
// A header another producer set that the port could not write back (its name, its length, one
// too many) is left out: every retry, requeue or dead-letter copy of the message would fail on it, and the
// message would come back for ever.
func fromSTOMP(hs []stomp.Header) map[string]any {
	types := map[string]string{}
	for _, h := range hs {
		if h.Key == hdrSTOMPTypes {
			for _, kv := range strings.Split(h.Value, ",") {
				if k, t, ok := strings.Cut(kv, "="); ok {
					types[k] = t
				}
			}
			break
		}
	}
	out := make(map[string]any, len(hs))
	for _, h := range hs {
		if stompBrokerHeader(h.Key) || !stompHeaderName.MatchString(h.Key) || len(h.Key)+1+2*len(h.Value) > stompMaxHeaderLine {
			continue
		}
		if _, seen := out[h.Key]; seen {
			continue
		}
		var v any = h.Value
		switch types[h.Key] {
		case "i":
			if n, err := strconv.ParseInt(h.Value, 10, 64); err == nil {
				if n == int64(int32(n)) {
					v = int32(n)
				} else {
					v = n
				}
			}
		case "b":
			if x, err := strconv.ParseBool(h.Value); err == nil {
				v = x
			}
		}
		out[h.Key] = v
	}
	// Likewise more headers than a copy could carry (another producer's message): the port's
	// bookkeeping is kept, and the application headers first by name up to what a message of the
	// port may carry.
	if extra := len(out) - (stompMaxHeaders - len(bookkeeping)); extra > 0 {
		keys := make([]string, 0, len(out))
		for k := range out {
			if !bookkeeping[k] {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys[max(len(keys)-extra, 0):] {
			delete(out, k)
		}
	}
	return out
}

// selectorString quotes s as a JMS selector string literal (” doubles a quote).
func selectorString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
