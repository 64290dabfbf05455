package httpapi

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// The JSON of a rate-limit refusal, as grpc-gateway renders a google.rpc.Status with an ErrorInfo
// and a RetryInfo (errorHandler's answer to the same refusal from the gRPC server).
type (
	restStatus struct {
		Code    codes.Code `json:"code"`
		Message string     `json:"message"`
		Details []any      `json:"details"`
	}
	restErrorInfo struct {
		Type     string            `json:"@type"`
		Reason   string            `json:"reason"`
		Domain   string            `json:"domain"`
		Metadata map[string]string `json:"metadata,omitempty"`
	}
	restRetryInfo struct {
		Type       string `json:"@type"`
		RetryDelay string `json:"retry_delay"`
	}
)

// writeRateLimited answers a rate-limit refusal of the precheck's (apperr.KindResourceExhausted,
// with a reason and RetryAfter) as errorHandler would answer it from the gRPC server — 429,
// Retry-After in whole seconds, the status as JSON — without converting it to a gRPC status and
// back: that round trip (details packed into Any values, unpacked, marshalled through protojson)
// was a quarter of the gateway's CPU under a flood of REST calls over their limit. It reports
// false, writing nothing, for any other error.
func writeRateLimited(w http.ResponseWriter, err error) bool {
	var e *apperr.Error
	if !errors.As(err, &e) || e.Kind != apperr.KindResourceExhausted || e.Reason == "" || e.RetryAfter <= 0 || e.Field != "" {
		return false
	}
	domain := cmp.Or(e.Domain, grpcx.ErrorDomain)
	body, jerr := json.Marshal(restStatus{Code: codes.ResourceExhausted, Message: e.Message, Details: []any{
		restErrorInfo{Type: "type.googleapis.com/google.rpc.ErrorInfo", Reason: e.Reason, Domain: domain, Metadata: e.Metadata},
		restRetryInfo{Type: "type.googleapis.com/google.rpc.RetryInfo", RetryDelay: protoDuration(e.RetryAfter)},
	}})
	if jerr != nil { // strings and a map of strings: cannot fail
		return false
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Retry-After", strconv.Itoa(int(math.Ceil(e.RetryAfter.Seconds()))))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
	return true
}

// protoDuration is d as protojson writes a google.protobuf.Duration: seconds, with 3, 6 or 9
// fractional digits when there are any ("1s", "0.100s", "2.497673469s"). d is positive.
func protoDuration(d time.Duration) string {
	secs, nanos := int64(d/time.Second), int64(d%time.Second)
	if nanos == 0 {
		return strconv.FormatInt(secs, 10) + "s"
	}
	frac := fmt.Sprintf("%09d", nanos)
	for strings.HasSuffix(frac, "000") {
		frac = frac[:len(frac)-3]
	}
	return strconv.FormatInt(secs, 10) + "." + frac + "s"
}
