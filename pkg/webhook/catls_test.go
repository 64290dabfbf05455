package webhook_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/webhook"
)

func certPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
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
