package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/tlsx"
)

// healthFlags are `integrationsctl health`'s settings.
type healthFlags struct {
	addr, service     string
	timeout           time.Duration
	tls               bool
	caFile, identity  string
	certFile, keyFile string
}

// healthCmd asks a server's grpc.health.v1 service whether it is SERVING: the Kubernetes exec
// probe (kubelet's built-in gRPC probe cannot speak TLS, and the internal ports are mTLS) and the
// image check's readiness poll. It exits 0 only for SERVING; anything else — another status, an
// unreachable server, a server that is not who --identity says — is one line on stderr and exit 1.
func healthCmd() *cobra.Command {
	var f healthFlags
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Check a server's gRPC health (grpc.health.v1); exit 0 when SERVING",
		Long: `Calls grpc.health.v1.Health/Check on --addr for --service ("" is the server as a whole)
and exits 0 when it answers SERVING, 1 otherwise, within --timeout.

Plaintext unless --tls. With --tls the server's certificate is verified against --ca-file (or
the system's roots): by host name, or — with --identity spiffe://integrations/<service> — by
the platform's internal rule, the chain against --ca-file and exactly that URI SAN, whatever
the address (as the services verify each other). The internal servers answer health without a
client certificate; --cert-file/--key-file present one anyway.

Example (a Kubernetes exec probe of settlement):
  integrationsctl health --addr 127.0.0.1:9094 --tls --ca-file /etc/integrations/tls/ca.crt \
    --identity spiffe://integrations/settlement`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.check(cmd.Context())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", "", "server address, HOST:PORT (required)")
	fl.StringVar(&f.service, "service", "", `health service name to check ("" is the whole server)`)
	fl.DurationVar(&f.timeout, "timeout", 2*time.Second, "give up after this long (connecting included)")
	fl.BoolVar(&f.tls, "tls", false, "speak TLS and verify the server")
	fl.StringVar(&f.caFile, "ca-file", "", "PEM CA bundle to verify the server against (with --tls; default the system's roots)")
	fl.StringVar(&f.identity, "identity", "", "the server's expected SPIFFE ID, spiffe://integrations/<service> (with --tls and --ca-file)")
	fl.StringVar(&f.certFile, "cert-file", "", "PEM client certificate to present (with --tls and --key-file)")
	fl.StringVar(&f.keyFile, "key-file", "", "PEM key of --cert-file")
	_ = cmd.MarkFlagRequired("addr")
	return cmd
}

// check runs the health check; its error is the one line the probe's log shows.
func (f healthFlags) check(ctx context.Context) error {
	if f.timeout <= 0 {
		return fmt.Errorf("--timeout: %v must be positive", f.timeout)
	}
	creds, err := f.dialOption()
	if err != nil {
		return err
	}
	conn, err := grpcx.Dial(f.addr, creds)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	// Not wait-for-ready: a connection refused or a failed handshake ends the call at once with
	// its cause, instead of being retried until the timeout hides it.
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: f.service})
	if err != nil {
		st := status.Convert(err)
		return fmt.Errorf("health of %s (service %q): %s: %s", f.addr, f.service, st.Code(), oneLine(st.Message()))
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health of %s (service %q): %s", f.addr, f.service, resp.GetStatus())
	}
	return nil
}

// dialOption is the transport the flags ask for.
func (f healthFlags) dialOption() (grpc.DialOption, error) {
	if !f.tls {
		for name, v := range map[string]string{"--ca-file": f.caFile, "--identity": f.identity, "--cert-file": f.certFile, "--key-file": f.keyFile} {
			if v != "" {
				return nil, fmt.Errorf("%s needs --tls", name)
			}
		}
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	if (f.certFile == "") != (f.keyFile == "") {
		return nil, errors.New("--cert-file and --key-file go together")
	}
	if f.identity != "" {
		id, err := url.Parse(f.identity)
		if err != nil {
			return nil, fmt.Errorf("--identity: %w", err)
		}
		peer, ok := tlsx.ServiceOf(id)
		if !ok {
			return nil, fmt.Errorf("--identity: %q is not spiffe://%s/<service>", f.identity, tlsx.TrustDomain)
		}
		if f.caFile == "" {
			return nil, errors.New("--identity needs --ca-file, the internal CA the server's certificate is verified against")
		}
		// The very credentials a platform service dials its peers with (chain against the
		// internal CA, exactly one URI SAN naming the peer, no host name check).
		in, err := grpcx.NewInternal(tlsx.Files{CertFile: f.certFile, KeyFile: f.keyFile, CAFile: f.caFile})
		if err != nil {
			return nil, err
		}
		return in.DialOption(peer), nil
	}
	// A client-facing port: the standard verification, host name included.
	host, _, err := net.SplitHostPort(f.addr)
	if err != nil {
		return nil, fmt.Errorf("--addr: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	if f.caFile != "" || f.certFile != "" {
		src, err := tlsx.NewSource(tlsx.Files{CertFile: f.certFile, KeyFile: f.keyFile, CAFile: f.caFile})
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = src.Pool() // nil without --ca-file: the system's roots
		if c := src.Certificate(); c != nil {
			cfg.Certificates = []tls.Certificate{*c}
		}
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}

// oneLine keeps a probe's message on one line: gRPC's connection errors may quote multi-line text.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
