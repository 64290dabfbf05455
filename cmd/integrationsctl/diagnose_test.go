package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDiagnosePrintsTheBrokerDiagnostic(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != diagnosePath || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte("executions OK round trip 3ms\nevents OK round trip 2ms\n"))
	}))
	defer srv.Close()

	out, err := runRoot(t, "diagnose", "--admin-url", srv.URL, "--admin-token", "tok")
	require.NoError(t, err)
	require.Equal(t, "executions OK round trip 3ms\nevents OK round trip 2ms\n", out)

	out, err = runRoot(t, "diagnose", "--admin-url", srv.URL, "--admin-token", "tok", "--output", "json")
	require.NoError(t, err)
	var d diagnosis
	require.NoError(t, json.Unmarshal([]byte(out), &d), out)
	require.Equal(t, diagnosis{OK: true, StatusCode: 200, Lines: []string{"executions OK round trip 3ms", "events OK round trip 2ms"}}, d)

	status = http.StatusServiceUnavailable
	_, err = runRoot(t, "diagnose", "--admin-url", srv.URL, "--admin-token", "tok")
	require.ErrorContains(t, err, "broker diagnostic failed (HTTP 503)")

	_, err = runRoot(t, "diagnose", "--admin-url", srv.URL, "--admin-token", "wrong")
	require.ErrorContains(t, err, "400 wrong request")
}
