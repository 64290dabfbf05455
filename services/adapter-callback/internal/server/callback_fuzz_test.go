package server

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/apperr"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	"github.com/integrations-platform/integrations/pkg/jsonbound"
)

func requireInvalid(t *testing.T, err error) {
	t.Helper()
	e, ok := apperr.As(err)
	if !ok || e.Kind != apperr.KindInvalidArgument || e.Field == "" || len(e.Message) > 512 {
		t.Fatalf("refusal is not a bounded INVALID_ARGUMENT naming a field: %v", err)
	}
}

func requireStorable(t *testing.T, what string, raw []byte) {
	t.Helper()
	if !utf8.Valid(raw) || bytes.Contains(raw, []byte(`\u0000`)) || !json.Valid(raw) {
		t.Fatalf("accepted %s not storable: %.200q", what, raw)
	}
}

// FuzzCallbackRequests: a callback as it arrives on the wire (which of the two is chosen by the
// first byte) is refused by the service's checks as INVALID_ARGUMENT naming a field, or what
// they let through is storable.
func FuzzCallbackRequests(f *testing.F) {
	for _, seed := range []struct {
		kind byte
		json string
		msg  proto.Message
	}{
		{0, `{"execution_id":"0190a0c2-0000-7000-8000-000000000001","attempt":1,"progress":{"percent":50}}`, &adapterv1.ReportProgressRequest{}},
		{0, `{"execution_id":"x","attempt":0,"progress":{"a":"\u0000"}}`, &adapterv1.ReportProgressRequest{}},
		{1, `{"execution_id":"0190a0c2-0000-7000-8000-000000000001","attempt":2,"succeeded":{"result":{"r":[1,{"s":"\u0000"}]}}}`, &adapterv1.CompleteRequest{}},
		{1, `{"execution_id":"0190a0c2-0000-7000-8000-000000000001","attempt":1,"failed":{"class":"perm\u0000","message":"m"}}`, &adapterv1.CompleteRequest{}},
	} {
		if err := protojson.Unmarshal([]byte(seed.json), seed.msg); err != nil {
			f.Fatal(err)
		}
		raw, err := proto.Marshal(seed.msg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append([]byte{seed.kind}, raw...))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) == 0 {
			return
		}
		if raw[0]%2 == 0 {
			req := &adapterv1.ReportProgressRequest{}
			if proto.Unmarshal(raw[1:], req) != nil {
				return
			}
			if err := checkAttemptRef(req.GetExecutionId(), req.GetAttempt()); err != nil {
				requireInvalid(t, err)
				return
			}
			progress, err := progressJSON(req)
			if err != nil {
				requireInvalid(t, err)
				return
			}
			requireStorable(t, "progress", progress)
			return
		}
		req := &adapterv1.CompleteRequest{}
		if proto.Unmarshal(raw[1:], req) != nil {
			return
		}
		if err := checkAttemptRef(req.GetExecutionId(), req.GetAttempt()); err != nil {
			requireInvalid(t, err)
			return
		}
		if err := checkResult(req); err != nil {
			requireInvalid(t, err)
			return
		}
		if res := req.GetSucceeded().GetResult(); res != nil {
			out, err := json.Marshal(res.AsMap())
			if err != nil {
				t.Fatalf("accepted result not encodable: %v", err)
			}
			requireStorable(t, "result", out)
		}
		if f := req.GetFailed(); f != nil {
			// Complete hands a failure to settlement through adaptercall.FromFailed.
			out := adaptercall.FromFailed(f)
			for _, v := range []string{out.Failure.Class, out.Failure.Code, out.Failure.Message} {
				if p := jsonbound.Problem(v); p != "" {
					t.Fatalf("failure text %q %s", v, p)
				}
			}
		}
	})
}
