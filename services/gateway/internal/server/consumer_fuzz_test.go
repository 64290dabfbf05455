package server

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/integrations-platform/integrations/pkg/apperr"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/webhook"
)

// FuzzConsumerRegistration: the registration request's validation, fed the REST body as the
// gateway decodes it (protojson), never panics; a refusal is always INVALID_ARGUMENT naming the
// consumer's field with a bounded message; an accepted endpoint is within the length bound, has
// the allowed scheme, and — private targets refused — names no special address and no name the
// (fake) resolver maps only to private addresses; and what is accepted without AllowPrivate is
// accepted with it. The seed corpus is testdata/fuzz/FuzzConsumerRegistration.
func FuzzConsumerRegistration(f *testing.F) {
	f.Add([]byte(`{"webhook":{"url":"https://hooks.example.com/in"}}`), false, false)
	f.Add([]byte(`{"webhook":{"url":"https://[::1%25lo]/"}}`), false, false)
	f.Add([]byte(`{"grpc":{"target":"rebind.example.com:443"}}`), false, false)
	f.Add([]byte(`{"grpc":{"target":"localhost:9000"}}`), true, true)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, body []byte, allowPrivate, allowHTTP bool) {
		var req gatewayv1.SetConsumerRequest
		if protojson.Unmarshal(body, &req) != nil {
			return // the REST layer answers 400 before the server sees it
		}
		s := &Server{opts: Options{WebhookAllowPrivate: allowPrivate, WebhookAllowHTTP: allowHTTP, Resolver: testResolver}}
		err := s.checkConsumer(ctx, &req)

		wantField := "consumer"
		var endpoint string
		switch c := req.GetConsumer().(type) {
		case *gatewayv1.SetConsumerRequest_Webhook:
			wantField, endpoint = "webhook.url", c.Webhook.GetUrl()
		case *gatewayv1.SetConsumerRequest_Grpc:
			wantField, endpoint = "grpc.target", c.Grpc.GetTarget()
		}
		if err != nil {
			var ae *apperr.Error
			if !errors.As(err, &ae) || ae.Kind != apperr.KindInvalidArgument || ae.Field != wantField {
				t.Fatalf("%q: refusal %v is not INVALID_ARGUMENT on %s", body, err, wantField)
			}
			if grpcx.ToStatus(err).Code() != codes.InvalidArgument {
				t.Fatalf("%q: refusal maps to %v", body, grpcx.ToStatus(err).Code())
			}
			if len(ae.Message) > 200 {
				t.Fatalf("%q: refusal message of %d bytes", body, len(ae.Message))
			}
			return
		}
		if wantField == "consumer" {
			t.Fatalf("%q: accepted without a consumer", body)
		}
		if endpoint == "" || len(endpoint) > webhook.MaxEndpointLength {
			t.Fatalf("%q: accepted an endpoint of %d bytes", body, len(endpoint))
		}
		var host string
		if wantField == "webhook.url" {
			u, perr := url.Parse(endpoint)
			if perr != nil || !(u.Scheme == "https" || u.Scheme == "http" && allowHTTP) {
				t.Fatalf("%q: accepted URL with scheme %v (%v)", body, u, perr)
			}
			host = u.Hostname()
		} else {
			host = endpoint[:strings.LastIndex(endpoint, ":")]
			host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		}
		if strings.Contains(host, "%") {
			t.Fatalf("%q: accepted zoned or percent-encoded host %q", body, host)
		}
		if !allowPrivate {
			if addr, perr := netip.ParseAddr(host); perr == nil && !webhook.PublicAddress(addr) {
				t.Fatalf("%q: accepted the special address %s", body, addr)
			}
			if addrs, ok := testResolver[webhook.Rooted(strings.ToLower(host))]; ok {
				public := false
				for _, a := range addrs {
					public = public || webhook.PublicAddress(netip.MustParseAddr(a).Unmap())
				}
				if !public {
					t.Fatalf("%q: accepted %q, which resolves only to private addresses", body, host)
				}
			}
			lax := &Server{opts: Options{WebhookAllowPrivate: true, WebhookAllowHTTP: allowHTTP, Resolver: testResolver}}
			if err := lax.checkConsumer(ctx, &req); err != nil {
				t.Fatalf("%q: accepted without AllowPrivate, refused with it: %v", body, err)
			}
		}
	})
}
