package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// A status holding invalid UTF-8 — in its message or in a field name — is cleaned before it is
// marshalled: grpc-gateway cannot marshal it and answered 500 "failed to marshal error message".
func TestErrorHandlerCleansInvalidUTF8(t *testing.T) {
	mux := runtime.NewServeMux(runtime.WithErrorHandler(errorHandler))
	for name, err := range map[string]error{
		"a foreign message":    status.Error(codes.InvalidArgument, "bad \xff value"),
		"an own field name":    grpcx.ToStatus(apperr.Invalid("q\xe9", "refused")).Err(),
		"an own message":       grpcx.ToStatus(apperr.Invalid("q", "refused \xc3")).Err(),
		"a foreign long field": status.Error(codes.NotFound, "x\xc3"),
	} {
		r := httptest.NewRequest(http.MethodGet, "/v1/executions", nil)
		w := httptest.NewRecorder()
		_, m := runtime.MarshalerForRequest(mux, r)
		errorHandler(r.Context(), mux, m, w, r, err)
		require.NotEqual(t, http.StatusInternalServerError, w.Code, "%s: %s", name, w.Body)
		require.True(t, utf8.Valid(w.Body.Bytes()), name)
		var body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body), name)
		require.Equal(t, int(status.Code(err)), body.Code, name)
		require.NotEmpty(t, body.Message, name)
	}
}
