package grpcx

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	"github.com/integrations-platform/integrations/pkg/apperr"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	"github.com/integrations-platform/integrations/pkg/safetext"
	"github.com/integrations-platform/integrations/pkg/tlsx"
)

// Internal is a service's identity on the platform's internal hops: the certificate it serves
// and presents, and the CA it verifies its peers against. A nil *Internal is plaintext (loopback
// development only; pkg/config refuses it elsewhere): its servers enforce no Policy and its
// dials carry no credentials.
type Internal struct {
	src *tlsx.Source
}

// NewInternal loads a service's internal identity; zero files mean plaintext (a nil *Internal).
func NewInternal(files tlsx.Files, opts ...tlsx.Option) (*Internal, error) {
	if files == (tlsx.Files{}) {
		return nil, nil
	}
	src, err := tlsx.NewSource(files, opts...)
	if err != nil {
		return nil, err
	}
	return &Internal{src: src}, nil
}

// ServiceIdentity loads the internal identity of the platform service named service, logging
// reloads, and checks that the certificate is that service's (spiffe://integrations/<service>):
// a certificate mounted into the wrong service fails at start, not at every peer's handshake.
// Zero files mean plaintext (a nil *Internal).
func ServiceIdentity(service string, files tlsx.Files, log *zap.Logger) (*Internal, error) {
	in, err := NewInternal(files, LogReloads(log))
	if in == nil || err != nil {
		return in, err
	}
	cert := in.src.Certificate()
	if cert == nil {
		return nil, errors.New("grpcx: the internal identity has no certificate")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("grpcx: the internal identity's certificate: %w", err)
	}
	if got, err := tlsx.IdentityOf(leaf); err == nil && got == service {
		return in, nil
	}
	return nil, fmt.Errorf("INTEGRATIONS_TLS_CERT_FILE: %s is not a certificate of %s (its URI SANs: %v)", files.CertFile, tlsx.ID(service), leaf.URIs)
}

// Enabled says whether the hops are mTLS.
func (in *Internal) Enabled() bool { return in != nil }

// DialOption is the transport credentials for calling the platform service peer (e.g.
// "settlement"): the caller's certificate presented, the server's chain and identity verified.
func (in *Internal) DialOption(peerService string) grpc.DialOption {
	if in == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(tlsx.ClientConfig(in.src, peerService)))
}

func (in *Internal) serverCredentials() credentials.TransportCredentials {
	return &mutualCreds{TransportCredentials: credentials.NewTLS(tlsx.MutualServerConfig(in.src)), src: in.src}
}

// mutualCreds verifies a client's certificate once, after the handshake, and keeps the outcome
// with the connection (peerInfo) for the Policy to read on each call. The outcome is bounded in
// time: a call after the certificate's expiry is refused (peerService), and an internal server
// closes each connection after maxConnectionAge (server.go), so that a CA replaced on disk —
// or a certificate revoked by rotating the CA — is checked again at the next handshake.
type mutualCreds struct {
	credentials.TransportCredentials
	src *tlsx.Source
}

// peerInfo is a connection's TLS state and its caller's identity, or why it has none.
type peerInfo struct {
	credentials.TLSInfo
	service  string
	notAfter time.Time // the client certificate's expiry: the identity is not honoured after it
	err      error
}

func (c *mutualCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, auth, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, auth, err
	}
	info, ok := auth.(credentials.TLSInfo)
	if !ok {
		return conn, auth, nil
	}
	id, verr := tlsx.VerifyClient(c.src, info.State)
	return conn, peerInfo{TLSInfo: info, service: id.Service, notAfter: id.NotAfter, err: verr}, nil
}

func (c *mutualCreds) Clone() credentials.TransportCredentials {
	return &mutualCreds{TransportCredentials: c.TransportCredentials.Clone(), src: c.src}
}

// LogReloads is a tlsx.OnReload that logs each reload of TLS files, and a failure as an error:
// the service keeps the last good certificate, which will expire.
func LogReloads(log *zap.Logger) tlsx.Option {
	return tlsx.OnReload(func(f tlsx.Files, err error) {
		fields := []zap.Field{zap.String("cert_file", f.CertFile), zap.String("ca_file", f.CAFile)}
		if err != nil {
			log.Error("TLS files changed but could not be loaded; the last good ones stay in use", append(fields, zap.Error(err))...)
			return
		}
		log.Info("TLS files reloaded", fields...)
	})
}

// PublicCredentials serves a client-facing listener with the Source's certificate (server
// authentication only: clients authenticate with API keys or adapter credentials); nil for a
// nil Source (plaintext).
func PublicCredentials(src *tlsx.Source) credentials.TransportCredentials {
	if src == nil {
		return nil
	}
	return credentials.NewTLS(tlsx.ServerConfig(src))
}

// Policy says which platform services may call which methods of an internal server, by full
// method ("/integrations.settlement.v1.SettlementService/Settle") or by service
// ("/integrations.settlement.v1.SettlementService/*"). It is enforced on a server with an
// Internal identity: the health service is open to anyone (kubelet and load-balancer probes
// present no client certificate); every other method needs a client certificate from the internal
// CA — UNAUTHENTICATED without one — naming a service the Policy lists for the method —
// PERMISSION_DENIED otherwise, and for a method the Policy does not name (deny by default).
type Policy map[string][]string

const healthPrefix = "/grpc.health.v1.Health/"

// authorize checks the caller of method against p.
func (p Policy) authorize(ctx context.Context, method string) error {
	if strings.HasPrefix(method, healthPrefix) {
		return nil
	}
	caller, err := peerService(ctx)
	if errors.Is(err, tlsx.ErrNoClientCertificate) {
		return apperr.Unauthenticated("a client certificate of the platform's internal CA is required")
	}
	if err != nil {
		return apperr.Unauthenticated("the client certificate is not accepted: %s", safetext.Truncate(err.Error(), 200))
	}
	allowed, listed := p[method]
	if !listed {
		if i := strings.LastIndexByte(method, '/'); i > 0 {
			allowed, listed = p[method[:i+1]+"*"]
		}
	}
	for _, name := range allowed {
		if name == caller {
			return nil
		}
	}
	if !listed {
		return apperr.New(apperr.KindPermissionDenied, errorsv1.ErrorReason_METHOD_NOT_ALLOWED.String(), "no platform service may call this method")
	}
	return apperr.New(apperr.KindPermissionDenied, errorsv1.ErrorReason_CALLER_NOT_ALLOWED.String(), "%s may not call this method", caller)
}

func peerService(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return "", tlsx.ErrNoClientCertificate
	}
	info, ok := p.AuthInfo.(peerInfo)
	if !ok {
		return "", tlsx.ErrNoClientCertificate // not an internal server's connection
	}
	if info.err != nil {
		return "", info.err
	}
	if t := now(); t.After(info.notAfter) {
		// Verified at the handshake, expired since: the connection outlived the certificate.
		return "", fmt.Errorf("the client certificate expired at %s, after this connection was opened: reconnect with a current one",
			info.notAfter.UTC().Format(time.RFC3339))
	}
	return info.service, nil
}

// now is the clock expiry is checked against (a variable for the tests).
var now = time.Now

func policyUnary(p Policy) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := p.authorize(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func policyStream(p Policy) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := p.authorize(ss.Context(), info.FullMethod); err != nil {
			return ToStatus(err).Err()
		}
		return handler(srv, ss)
	}
}

// PublicDialOption is the transport credentials for a client of a client-facing port: TLS with
// the standard verification, against caFile if given (a private CA) or the system's roots.
func PublicDialOption(caFile string) (grpc.DialOption, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		src, err := tlsx.NewSource(tlsx.Files{CAFile: caFile})
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = src.Pool()
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}
