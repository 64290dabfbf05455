package platformtoken

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
)

// digestDomain starts every digest's input: a digest of this encoding is never equal to a hash
// of anything else, and a later encoding (a field added to a request) gets a new name.
const digestDomain = "integrations.platformtoken.request.v1\x00"

// Digest is the request digest a token's req claim carries: the base64url (unpadded) SHA-256 of
// a canonical encoding of every field of an ExecuteRequest or a CancelRequest, so that a token
// captured on its way to an adapter cannot run other work (another capability, payload, mode,
// callback token or deadline) on it.
//
// The encoding is this package's own, not the request's protobuf bytes, nor deterministic proto
// marshalling: protobuf-go documents deterministic output as stable only within one build of the
// library, and the platform and an adapter are built and upgraded separately (an adapter may not
// even be written in Go). The encoding is defined on the decoded values, so that both sides
// compute it from what they hold: the platform from the request it sends, the SDK from the one it
// received. Each value is a one-byte tag and its content, every length and count an 8-byte
// big-endian number:
//
//	execution_id, capability    's' len bytes
//	attempt, mode               'i' int64 (two's complement)
//	callback_token              's' over its SHA-256 (the token itself is a secret)
//	payload                     a Struct (absent: the empty Struct, as the SDK hands the handler)
//	deadline_time, deadline_in  '-' absent, or 't' seconds nanos (each int64, two's complement)
//	Struct                      'm' count, then per key in byte order: 's' key, Value
//	Value                       '0' no kind, 'n' null, 'b' 0|1, 'f' IEEE-754 bits, 's' string,
//	                            Struct, 'l' count Values
//
// An ExecuteRequest's digest is over 'E' and its fields in field-number order, a CancelRequest's
// over 'C' and its fields. The adapter protocol specifies it for other languages, with a worked
// example; testdata/vectors.json holds its test vectors. A field added to either later is covered
// only under a new digestDomain; until then it is not bound to the token, and must not change
// what work runs.
func Digest(req proto.Message) (string, error) {
	h := sha256.New()
	if err := encode(h, req); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)), nil
}

// encode writes the digest's input for req — digestDomain and the canonical encoding — to w.
func encode(w io.Writer, req proto.Message) error {
	d := digester{h: w}
	d.write([]byte(digestDomain))
	switch r := req.(type) {
	case *adapterv1.ExecuteRequest:
		d.tag('E')
		d.str(r.GetExecutionId())
		d.int(int64(r.GetAttempt()))
		d.str(r.GetCapability())
		d.strct(r.GetPayload())
		d.timestamp(r.GetDeadlineTime())
		sum := sha256.Sum256([]byte(r.GetCallbackToken()))
		d.str(string(sum[:]))
		d.int(int64(r.GetMode()))
		d.duration(r.GetDeadlineIn())
	case *adapterv1.CancelRequest:
		d.tag('C')
		d.str(r.GetExecutionId())
		d.int(int64(r.GetAttempt()))
	default:
		return fmt.Errorf("request digest: a %T is not a request to an adapter", req)
	}
	return nil
}

// digester writes the canonical encoding into a hash (or, for the test vectors, a buffer): a
// writer that never fails.
type digester struct {
	h   io.Writer
	buf [8]byte
}

// write writes p; the writers here, a hash or a bytes.Buffer, never return an error.
func (d *digester) write(p []byte) { _, _ = d.h.Write(p) }

func (d *digester) tag(b byte) { d.write([]byte{b}) }

func (d *digester) u64(n uint64) {
	binary.BigEndian.PutUint64(d.buf[:], n)
	d.write(d.buf[:])
}

func (d *digester) int(n int64) {
	d.tag('i')
	d.u64(uint64(n))
}

func (d *digester) str(s string) {
	d.tag('s')
	d.u64(uint64(len(s)))
	d.write([]byte(s))
}

func (d *digester) timestamp(t *timestamppb.Timestamp) {
	d.secondsNanos(t != nil, t.GetSeconds(), t.GetNanos())
}

func (d *digester) duration(t *durationpb.Duration) {
	d.secondsNanos(t != nil, t.GetSeconds(), t.GetNanos())
}

// secondsNanos writes a Timestamp or a Duration, which are encoded alike: '-' when absent, else
// 't', the seconds and the nanoseconds.
func (d *digester) secondsNanos(present bool, secs int64, nanos int32) {
	if !present {
		d.tag('-')
		return
	}
	d.tag('t')
	d.u64(uint64(secs))
	d.u64(uint64(int64(nanos)))
}

func (d *digester) strct(s *structpb.Struct) {
	fields := s.GetFields()
	d.tag('m')
	d.u64(uint64(len(fields)))
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		d.str(k)
		d.value(fields[k])
	}
}

func (d *digester) value(v *structpb.Value) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		d.tag('n')
	case *structpb.Value_BoolValue:
		d.tag('b')
		if k.BoolValue {
			d.tag(1)
		} else {
			d.tag(0)
		}
	case *structpb.Value_NumberValue:
		d.tag('f')
		d.u64(math.Float64bits(k.NumberValue))
	case *structpb.Value_StringValue:
		d.str(k.StringValue)
	case *structpb.Value_StructValue:
		d.strct(k.StructValue)
	case *structpb.Value_ListValue:
		vals := k.ListValue.GetValues()
		d.tag('l')
		d.u64(uint64(len(vals)))
		for _, e := range vals {
			d.value(e)
		}
	default:
		d.tag('0')
	}
}
