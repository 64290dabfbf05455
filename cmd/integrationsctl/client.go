package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// clientFlags are the flags of the commands that call the gateway as an application.
type clientFlags struct {
	gateway string
	apiKey  string
	// tls dials the gateway with TLS, verified against caFile if given or the system's roots.
	tls    bool
	caFile string
	// output is how read commands print: text (for people) or json.
	output string
}

func (f *clientFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.gateway, "gateway", envOr("INTEGRATIONS_GATEWAY_ADDR", "127.0.0.1:9090"), "gateway gRPC address (env INTEGRATIONS_GATEWAY_ADDR)")
	cmd.PersistentFlags().StringVar(&f.apiKey, "api-key", os.Getenv("INTEGRATIONS_API_KEY"), "application API key (env INTEGRATIONS_API_KEY)")
	cmd.PersistentFlags().BoolVar(&f.tls, "tls", os.Getenv("INTEGRATIONS_GATEWAY_TLS") == "true",
		"dial the gateway with TLS (env INTEGRATIONS_GATEWAY_TLS=true; implied by --ca-file)")
	cmd.PersistentFlags().StringVar(&f.caFile, "ca-file", os.Getenv("INTEGRATIONS_GATEWAY_CA_FILE"),
		"CA certificate (PEM) to verify the gateway's with, instead of the system's roots (env INTEGRATIONS_GATEWAY_CA_FILE)")
	cmd.PersistentFlags().StringVarP(&f.output, "output", "o", outputText, "how read commands print: text or json")
}

func (f *clientFlags) dial(ctx context.Context) (gatewayv1.GatewayServiceClient, context.Context, func(), error) {
	if err := f.checkOutput(); err != nil {
		return nil, nil, nil, err
	}
	if f.apiKey == "" {
		return nil, nil, nil, errors.New("an API key is required: --api-key or INTEGRATIONS_API_KEY")
	}
	var opts []grpc.DialOption
	if f.tls || f.caFile != "" {
		opt, err := grpcx.PublicDialOption(f.caFile)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--ca-file: %w", err)
		}
		opts = append(opts, opt)
	}
	conn, err := grpcx.Dial(f.gateway, opts...)
	if err != nil {
		return nil, nil, nil, err
	}
	return gatewayv1.NewGatewayServiceClient(conn), grpcx.WithBearer(ctx, f.apiKey), func() { _ = conn.Close() }, nil
}

var printJSON = protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}

func invokeCmd(f *clientFlags) *cobra.Command {
	var (
		payload, mode, idempotencyKey string
		wait                          bool
		timeout                       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "invoke CAPABILITY",
		Short: "Invoke a capability; with --wait, follow an async execution until it settles",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			p := &structpb.Struct{}
			if err := protojson.Unmarshal([]byte(payload), p); err != nil {
				return fmt.Errorf("--payload: not a JSON object: %w", err)
			}
			m := executionv1.Mode_MODE_ASYNC
			switch mode {
			case "async":
			case "sync":
				m = executionv1.Mode_MODE_SYNC
			default:
				return fmt.Errorf("--mode: %q is not async or sync", mode)
			}
			resp, err := client.InvokeCapability(ctx, &gatewayv1.InvokeCapabilityRequest{
				Capability: args[0], Mode: m, Payload: p, IdempotencyKey: idempotencyKey,
			})
			if err != nil {
				return err
			}
			e := resp.GetExecution()
			out := cmd.OutOrStdout()
			if !wait || isFinal(e.GetStatus()) {
				fmt.Fprintf(out, "execution %s %s attempt %d\n", e.GetId(), e.GetStatus(), e.GetAttempt())
				fmt.Fprintln(out, printJSON.Format(e))
				return nil
			}
			// On a terminal, one line rewritten as the execution moves; piped, only the settled
			// execution, so that a script reads one JSON document.
			live := isTerminal(out)
			last := ""
			show := func(e *executionv1.Execution) {
				if line := progressLine(e); live && line != last {
					fmt.Fprintf(out, "\r\033[K%s", line)
					last = line
				}
			}
			show(e)
			deadline := time.Now().Add(timeout)
			for !isFinal(e.GetStatus()) {
				if time.Now().After(deadline) {
					if live {
						fmt.Fprintln(out)
					}
					return fmt.Errorf("execution %s not settled within %s", e.GetId(), timeout)
				}
				time.Sleep(200 * time.Millisecond) // polling the API: the CLI has no event stream
				got, err := client.GetExecution(ctx, &gatewayv1.GetExecutionRequest{Id: e.GetId()})
				if err != nil {
					return err
				}
				e = got.GetExecution()
				show(e)
			}
			if live {
				fmt.Fprintln(out)
			}
			fmt.Fprintln(out, printJSON.Format(e))
			return nil
		},
	}
	cmd.Flags().StringVar(&payload, "payload", "{}", "the request payload, a JSON object")
	cmd.Flags().StringVar(&mode, "mode", "async", "async or sync")
	cmd.Flags().StringVar(&idempotencyKey, "idempotency-key", "", "idempotency key")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the execution settles; on a terminal, show a live line of its status, attempt and progress")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "how long --wait waits")
	return cmd
}

func isFinal(s executionv1.ExecutionStatus) bool {
	switch s {
	case executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED,
		executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED:
		return true
	}
	return false
}

func getCmd(f *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use: "get EXECUTION_ID", Short: "Show an execution with its attempts", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.GetExecution(ctx, &gatewayv1.GetExecutionRequest{Id: args[0]})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), printJSON.Format(resp.GetExecution()))
			return nil
		},
	}
}

func listCmd(f *clientFlags) *cobra.Command {
	var limit int32
	cmd := &cobra.Command{
		Use: "list", Short: "List the application's executions, newest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, done, err := f.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListExecutions(ctx, &gatewayv1.ListExecutionsRequest{PageSize: limit})
			if err != nil {
				return err
			}
			if f.output == outputJSON {
				writeJSON(cmd.OutOrStdout(), resp)
				return nil
			}
			for _, e := range resp.GetExecutions() {
				fmt.Fprintf(cmd.OutOrStdout(), "%s  %-28s %-20s attempt %d\n", e.GetId(), e.GetStatus(), e.GetCapability(), e.GetAttempt())
			}
			return nil
		},
	}
	cmd.Flags().Int32Var(&limit, "limit", 20, "how many")
	return cmd
}

func consumerCmd(f *clientFlags) *cobra.Command {
	var secretFile string
	cmd := &cobra.Command{Use: "consumer", Short: "Register where the application's events are delivered; rotate its signing secret"}
	set := &cobra.Command{
		Use: "set-webhook URL", Short: "Register a webhook; prints (or writes) its signing secret", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return setConsumer(cmd, f, secretFile, &gatewayv1.SetConsumerRequest{
				Consumer: &gatewayv1.SetConsumerRequest_Webhook{Webhook: &gatewayv1.WebhookConsumer{Url: args[0]}},
			})
		},
	}
	set.Flags().StringVar(&secretFile, "secret-file", "", "write the signing secret to this file (mode 0600) instead of printing it")
	var caFile, grpcSecretFile string
	var plaintext bool
	setGRPC := &cobra.Command{
		Use: "set-grpc HOST:PORT", Args: cobra.ExactArgs(1),
		Short: "Register a gRPC EventConsumerService endpoint, called over TLS and signed; prints (or writes) its signing secret",
		RunE: func(cmd *cobra.Command, args []string) error {
			c := &gatewayv1.GrpcConsumer{Target: args[0]}
			if plaintext {
				c.Plaintext = &plaintext
			}
			if caFile != "" {
				pem, err := os.ReadFile(caFile)
				if err != nil {
					return fmt.Errorf("--ca-file: %w", err)
				}
				ca := string(pem)
				c.CaPem = &ca
			}
			return setConsumer(cmd, f, grpcSecretFile, &gatewayv1.SetConsumerRequest{
				Consumer: &gatewayv1.SetConsumerRequest_Grpc{Grpc: c},
			})
		},
	}
	setGRPC.Flags().StringVar(&caFile, "ca-file", "", "PEM CA certificates the consumer's certificate chains to (default: the system roots)")
	setGRPC.Flags().BoolVar(&plaintext, "plaintext", false, "call the consumer without TLS (only where the deployment allows http webhooks)")
	setGRPC.Flags().StringVar(&grpcSecretFile, "secret-file", "", "write the signing secret to this file (mode 0600) instead of printing it")
	var rotateFile string
	rotate := &cobra.Command{
		Use:   "rotate-secret",
		Short: "Replace the signing secret; prints (or writes) the new one — the previous one keeps signing until the time printed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, done, err := f.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.RotateSigningSecret(ctx, &gatewayv1.RotateSigningSecretRequest{})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if err := writeSecret(out, rotateFile, resp.GetSigningSecret()); err != nil {
				return err
			}
			if t := resp.GetPreviousSecretExpireTime(); t != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "the previous secret also signs until %s\n", t.AsTime().Format(time.RFC3339))
			}
			return nil
		},
	}
	rotate.Flags().StringVar(&rotateFile, "secret-file", "", "write the new signing secret to this file (mode 0600) instead of printing it")
	cmd.AddCommand(set, setGRPC, rotate)
	return cmd
}

func setConsumer(cmd *cobra.Command, f *clientFlags, secretFile string, req *gatewayv1.SetConsumerRequest) error {
	client, ctx, done, err := f.dial(cmd.Context())
	if err != nil {
		return err
	}
	defer done()
	resp, err := client.SetConsumer(ctx, req)
	if err != nil {
		return err
	}
	return writeSecret(cmd.OutOrStdout(), secretFile, resp.GetSigningSecret())
}

// writeSecret prints a signing secret, or writes it to file (mode 0600) and says so.
func writeSecret(out io.Writer, file, secret string) error {
	if file == "" {
		fmt.Fprintln(out, secret)
		return nil
	}
	if err := os.WriteFile(file, []byte(secret), 0o600); err != nil {
		return fmt.Errorf("write signing secret: %w", err)
	}
	fmt.Fprintf(out, "signing secret written to %s\n", file)
	return nil
}

func eventsCmd(f *clientFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "events", Short: "List, read, redeliver and redrive the application's events"}
	get := &cobra.Command{
		Use: "get EVENT_ID", Short: "Show an event with its delivery attempts", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.GetEvent(ctx, &gatewayv1.GetEventRequest{Id: args[0]})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), printJSON.Format(resp.GetEvent()))
			return nil
		},
	}
	redeliver := &cobra.Command{
		Use: "redeliver EVENT_ID", Short: "Deliver an event again, with a fresh attempt budget", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.RedeliverEvent(ctx, &gatewayv1.RedeliverEventRequest{Id: args[0]})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "event %s %s\n", resp.GetEvent().GetId(), resp.GetEvent().GetStatus())
			return nil
		},
	}
	var redriveSince string
	redrive := &cobra.Command{
		Use: "redrive", Short: "Deliver every dead event again (optionally only those created since a time)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := parseTime("--since", redriveSince)
			if err != nil {
				return err
			}
			client, ctx, done, err := f.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.RedriveEvents(ctx, &gatewayv1.RedriveEventsRequest{Since: ts})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d dead events redriven\n", resp.GetCount())
			return nil
		},
	}
	redrive.Flags().StringVar(&redriveSince, "since", "", "only dead events created at or after this time (RFC 3339, or a duration ago: 2h)")
	cmd.AddCommand(eventsListCmd(f), get, redeliver, redrive)
	return cmd
}

func eventsListCmd(f *clientFlags) *cobra.Command {
	var (
		limit        int32
		status, exec string
		since, until string
	)
	list := &cobra.Command{
		Use: "list", Short: "List the application's events, newest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &gatewayv1.ListEventsRequest{PageSize: limit, ExecutionId: exec}
			if status != "" {
				v, ok := eventsv1.EventStatus_value["EVENT_STATUS_"+strings.ToUpper(status)]
				if !ok {
					return fmt.Errorf("--status: %q is not pending, delivered or dead", status)
				}
				req.Status = eventsv1.EventStatus(v)
			}
			var err error
			if req.Since, err = parseTime("--since", since); err != nil {
				return err
			}
			if req.Until, err = parseTime("--until", until); err != nil {
				return err
			}
			client, ctx, done, err := f.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListEvents(ctx, req)
			if err != nil {
				return err
			}
			if f.output == outputJSON {
				writeJSON(cmd.OutOrStdout(), resp)
				return nil
			}
			for _, e := range resp.GetEvents() {
				fmt.Fprintf(cmd.OutOrStdout(), "%s  %-24s %-22s execution %s  attempts %d  %s\n", e.GetId(), e.GetStatus(),
					e.GetType(), e.GetExecutionId(), e.GetAttempts(), e.GetCreateTime().AsTime().Format(time.RFC3339))
			}
			return nil
		},
	}
	list.Flags().Int32Var(&limit, "limit", 20, "how many")
	list.Flags().StringVar(&status, "status", "", "only pending, delivered or dead events")
	list.Flags().StringVar(&exec, "execution", "", "only the events of this execution")
	list.Flags().StringVar(&since, "since", "", "only events created at or after this time (RFC 3339, or a duration ago: 2h)")
	list.Flags().StringVar(&until, "until", "", "only events created before this time (RFC 3339, or a duration ago)")
	return list
}

// parseTime reads a flag's time: RFC 3339, or a duration meaning that long ago; empty is unset.
func parseTime(flag, v string) (*timestamppb.Timestamp, error) {
	if v == "" {
		return nil, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return timestamppb.New(t), nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return timestamppb.New(time.Now().Add(-d)), nil
	}
	return nil, fmt.Errorf("%s: %q is neither an RFC 3339 time nor a duration", flag, v)
}

// isTerminal tells whether w is a terminal (a variable: tests stand in for one).
var isTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressLine is invoke --wait's live line: status, attempt and, when the adapter reported one,
// its progress percentage (a "percent" number in the progress object).
func progressLine(e *executionv1.Execution) string {
	line := fmt.Sprintf("execution %s  %s  attempt %d/%d", e.GetId(),
		strings.TrimPrefix(e.GetStatus().String(), "EXECUTION_STATUS_"), e.GetAttempt(), e.GetMaxAttempts())
	if p, ok := e.GetProgress().GetFields()["percent"]; ok {
		if _, isNum := p.GetKind().(*structpb.Value_NumberValue); isNum {
			line += fmt.Sprintf("  %.0f%%", p.GetNumberValue())
		}
	}
	return line
}
