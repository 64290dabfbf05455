package main

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/adaptercheck"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// adapterCmd groups the commands for adapter authors.
func adapterCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "adapter", Short: "Tools for adapter authors"}
	cmd.AddCommand(adapterCheckCmd())
	return cmd
}

// adapterCheckFlags are `integrationsctl adapter check`'s settings.
type adapterCheckFlags struct {
	addr, adapterID, keyFile    string
	capability, payload         string
	longCapability, longPayload string
	callbackListen, credential  string
	tls                         bool
	caFile                      string
	syncTimeout, lease, grace   time.Duration
	deadline, wait, trustWait   time.Duration
}

// adapterCheckCmd is pkg/adaptercheck's command line: it plays the platform against an adapter and
// prints one line per rule; any failed rule exits 1.
func adapterCheckCmd() *cobra.Command {
	var f adapterCheckFlags
	var rules strings.Builder
	for _, r := range adaptercheck.Rules {
		fmt.Fprintf(&rules, "  %-32s %s\n", r.Rule, r.What)
	}
	cmd := &cobra.Command{
		Use:   "check --addr HOST:PORT --adapter-id ID --capability NAME [--payload JSON] [--long-payload JSON]",
		Short: "Check that an adapter keeps the adapter protocol, playing the platform against it",
		Long: `Plays the platform against the adapter at --addr (docs/adapter-protocol.md): signs its calls
as the platform does, forges, expires and replays tokens, and serves AdapterCallbackService
itself on --callback-listen, answering callbacks as the platform's adapter-callback service does.
Prints one line per rule (PASS, FAIL, WARN, SKIP) and exits 1 if any rule failed.

Rules:
` + rules.String() + `
The adapter must trust the check's key and call back to the check:
  - --platform-key FILE signs with that private key (` + "`integrationsctl platform-key generate`" + ` makes
    one and prints its public key); without it the check generates a key, prints the public key,
    and waits (--trust-wait) until the adapter accepts it.
  - start the adapter with INTEGRATIONS_PLATFORM_PUBLIC_KEYS=<the public key>, its id as
    --adapter-id, and its callback address (for adapters on the Go SDK, INTEGRATIONS_CALLBACK_ADDR)
    set to --callback-listen.

--payload must make the adapter answer within a sync call; --long-payload must make it answer
Accepted for async work that outlasts --lease and ends in Complete (without it the long-work
rules are skipped). The dummy adapter, for example:
  integrationsctl adapter check --addr 127.0.0.1:9096 --adapter-id dummy --platform-key check.key \
    --capability dummy.echo --payload '{"n":1}' \
    --long-payload '{"dummy":{"complete_later_ms":4000}}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", "", "the adapter's AdapterService, HOST:PORT (required)")
	fl.StringVar(&f.adapterID, "adapter-id", "", "the adapter's catalog id: the tokens' audience (required)")
	fl.StringVar(&f.keyFile, "platform-key", "", "private key file to sign with (default: generate one and print its public key)")
	fl.StringVar(&f.capability, "capability", "", "capability of the sync calls (required)")
	fl.StringVar(&f.payload, "payload", "{}", "JSON object that makes the adapter answer within a sync call")
	fl.StringVar(&f.longCapability, "long-capability", "", "capability of the long work (default --capability)")
	fl.StringVar(&f.longPayload, "long-payload", "", "JSON object that makes the adapter answer Accepted (async) for work outlasting --lease")
	fl.StringVar(&f.callbackListen, "callback-listen", "127.0.0.1:9093", "where the check serves AdapterCallbackService: the adapter's callback address")
	fl.StringVar(&f.credential, "credential", "", "the bearer credential callbacks must carry (default: any)")
	fl.BoolVar(&f.tls, "tls", false, "dial the adapter over TLS, verified against --ca-file or the system's roots (the platform dials adapters in plaintext today)")
	fl.StringVar(&f.caFile, "ca-file", "", "PEM CA bundle to verify the adapter's certificate against (implies --tls)")
	fl.DurationVar(&f.syncTimeout, "timeout", adaptercheck.DefaultSyncTimeout, "a sync call's deadline (the capability's sync timeout)")
	fl.DurationVar(&f.lease, "lease", adaptercheck.DefaultLease, "the capability's lease: the most granted for Accepted and each renewal")
	fl.DurationVar(&f.grace, "lease-grace", adaptercheck.DefaultLeaseGrace, "how late after the lease a renewal still counts")
	fl.DurationVar(&f.deadline, "deadline", adaptercheck.DefaultDeadline, "an async execution's deadline")
	fl.DurationVar(&f.wait, "wait", adaptercheck.DefaultWait, "how long to await a retried Complete (at least 10s)")
	fl.DurationVar(&f.trustWait, "trust-wait", 5*time.Minute, "without --platform-key, how long to wait for the adapter to accept the generated key")
	_ = cmd.MarkFlagRequired("addr")
	_ = cmd.MarkFlagRequired("adapter-id")
	_ = cmd.MarkFlagRequired("capability")
	return cmd
}

func (f adapterCheckFlags) run(cmd *cobra.Command) error {
	cfg := adaptercheck.Config{
		Addr: f.addr, AdapterID: f.adapterID, Capability: f.capability, LongCapability: f.longCapability,
		Credential: f.credential, SyncTimeout: f.syncTimeout, Lease: f.lease, LeaseGrace: f.grace,
		Deadline: f.deadline, Wait: f.wait,
	}
	var err error
	if cfg.Payload, err = jsonObject("--payload", f.payload); err != nil {
		return err
	}
	if f.longPayload != "" {
		if cfg.LongPayload, err = jsonObject("--long-payload", f.longPayload); err != nil {
			return err
		}
	}
	if f.tls || f.caFile != "" {
		opt, err := grpcx.PublicDialOption(f.caFile)
		if err != nil {
			return fmt.Errorf("--ca-file: %w", err)
		}
		cfg.DialOptions = []grpc.DialOption{opt}
	}
	out := cmd.OutOrStdout()
	if f.keyFile != "" {
		b, err := os.ReadFile(f.keyFile)
		if err != nil {
			return fmt.Errorf("--platform-key: %w", err)
		}
		if cfg.Key, err = platformtoken.ParsePrivateKey(string(b)); err != nil {
			return fmt.Errorf("--platform-key %s: %w", f.keyFile, err)
		}
		pub := cfg.Key.Public().(ed25519.PublicKey)
		fmt.Fprintf(out, "signing with key %s (INTEGRATIONS_PLATFORM_PUBLIC_KEYS=%s)\n", platformtoken.KeyID(pub), platformtoken.EncodePublicKey(pub))
	} else {
		pub, priv, err := platformtoken.Generate()
		if err != nil {
			return err
		}
		cfg.Key = priv
		fmt.Fprintf(out, "generated a signing key; start the adapter with:\n  INTEGRATIONS_PLATFORM_PUBLIC_KEYS=%s\n", platformtoken.EncodePublicKey(pub))
	}
	if cfg.LongPayload != nil {
		lis, err := net.Listen("tcp", f.callbackListen)
		if err != nil {
			return fmt.Errorf("--callback-listen: %w", err)
		}
		cfg.Callbacks = lis // Run closes it
		fmt.Fprintf(out, "serving AdapterCallbackService on %s: the adapter's callback address\n", lis.Addr())
	}
	if f.keyFile == "" {
		fmt.Fprintf(out, "waiting up to %s for the adapter at %s to accept the key...\n", f.trustWait, f.addr)
		ctx, cancel := context.WithTimeout(cmd.Context(), f.trustWait)
		err := adaptercheck.WaitTrusted(ctx, cfg)
		cancel()
		if err != nil {
			if cfg.Callbacks != nil {
				_ = cfg.Callbacks.Close()
			}
			return err
		}
	}
	fmt.Fprintf(out, "checking the adapter %q at %s\n", f.adapterID, f.addr)
	report, err := adaptercheck.Run(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	if err := report.Write(out); err != nil {
		return err
	}
	if failed := report.Failed(); len(failed) > 0 {
		names := make([]string, len(failed))
		for i, r := range failed {
			names[i] = string(r)
		}
		return fmt.Errorf("adapter check: %d rules failed: %s", len(failed), strings.Join(names, ", "))
	}
	return nil
}

// jsonObject reads flag's value, a JSON object.
func jsonObject(flag, text string) (*structpb.Struct, error) {
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object: %w", flag, err)
	}
	if m == nil {
		return nil, errors.New(flag + ": not a JSON object")
	}
	st, err := structpb.NewStruct(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return st, nil
}
