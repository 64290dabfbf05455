package webhook_test

import (
	"encoding/pem"
	"os"
	"strings"
	"testing"

	"github.com/integrations-platform/integrations/pkg/tlsx/devca"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/webhook"
)

// certPEM is a CA certificate in PEM, a fresh one each call (devca's, as make run's).
func certPEM(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	_, err := devca.NewCA(dir)
	require.NoError(t, err)
	pem, err := os.ReadFile(devca.CAFile(dir))
	require.NoError(t, err)
	return string(pem)
}

func TestParseCAPEM(t *testing.T) {
	t.Parallel()
	a, b := certPEM(t), certPEM(t)
	for _, ok := range []string{a, a + b, "\n  " + a + "\n\n" + b + "\n"} {
		pool, err := webhook.ParseCAPEM(ok)
		require.NoError(t, err)
		require.NotNil(t, pool)
	}
	key := string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{1, 2, 3}}))
	garbled := strings.Replace(a, "MII", "MXX", 1)
	for name, bad := range map[string]string{
		"empty":             "",
		"blank":             " \n",
		"not PEM":           "hello",
		"trailing garbage":  a + "junk",
		"a private key":     a + key,
		"not a certificate": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("nope")})),
		"garbled":           garbled,
		"too long":          a + strings.Repeat(" ", webhook.MaxCAPEMLength),
	} {
		_, err := webhook.ParseCAPEM(bad)
		require.ErrorIs(t, err, webhook.ErrRefused, name)
		require.NotContains(t, err.Error(), "BEGIN", "%s: the input is never repeated", name)
	}
}
