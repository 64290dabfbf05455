package webhook

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
)

// MaxCAPEMLength bounds the CA bundle a gRPC consumer may be registered with, in bytes: room for
// dozens of certificates, far more than a private CA's chain needs.
const MaxCAPEMLength = 64 << 10

// ParseCAPEM reads the CA bundle of a gRPC consumer: one or more PEM "CERTIFICATE" blocks, each
// an X.509 certificate, with nothing but white space around them. The gateway refuses at
// registration what it refuses; the event router reads the stored bundle with it again before
// dialling. Its errors (*RefusedError) never repeat the input.
func ParseCAPEM(s string) (*x509.CertPool, error) {
	if strings.TrimSpace(s) == "" {
		return nil, refused("no certificate: give PEM CERTIFICATE blocks, or leave it out for the system roots")
	}
	if len(s) > MaxCAPEMLength {
		return nil, refused("longer than %d bytes", MaxCAPEMLength)
	}
	pool := x509.NewCertPool()
	rest := []byte(s)
	for n := 1; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, refused("PEM block %d is not a CERTIFICATE (a private key or anything else is never taken)", n)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, refused("PEM block %d is not a valid X.509 certificate", n)
		}
		pool.AddCert(cert)
	}
	if strings.TrimSpace(string(rest)) != "" {
		return nil, refused("not PEM: only CERTIFICATE blocks and white space are taken")
	}
	return pool, nil
}
