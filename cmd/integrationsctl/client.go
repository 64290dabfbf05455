package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// clientFlags are the flags of the commands that call the gateway as an application.
type clientFlags struct {
	gateway string
	apiKey  string
}

func (f *clientFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.gateway, "gateway", envOr("INTEGRATIONS_GATEWAY_ADDR", "127.0.0.1:9090"), "gateway gRPC address (env INTEGRATIONS_GATEWAY_ADDR)")
	cmd.PersistentFlags().StringVar(&f.apiKey, "api-key", os.Getenv("INTEGRATIONS_API_KEY"), "application API key (env INTEGRATIONS_API_KEY)")
}

func (f *clientFlags) dial(ctx context.Context) (gatewayv1.GatewayServiceClient, context.Context, func(), error) {
	if f.apiKey == "" {
		return nil, nil, nil, errors.New("an API key is required: --api-key or INTEGRATIONS_API_KEY")
	}
	conn, err := grpcx.Dial(f.gateway)
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
			fmt.Fprintf(out, "execution %s %s attempt %d\n", e.GetId(), e.GetStatus(), e.GetAttempt())
			if !wait || isFinal(e.GetStatus()) {
				fmt.Fprintln(out, printJSON.Format(e))
				return nil
			}
			deadline := time.Now().Add(timeout)
			last := e.GetStatus().String() + fmt.Sprint(e.GetAttempt())
			for !isFinal(e.GetStatus()) {
				if time.Now().After(deadline) {
					return fmt.Errorf("execution %s not settled within %s", e.GetId(), timeout)
				}
				time.Sleep(200 * time.Millisecond) // polling the API: the CLI has no event stream
				got, err := client.GetExecution(ctx, &gatewayv1.GetExecutionRequest{Id: e.GetId()})
				if err != nil {
					return err
				}
				e = got.GetExecution()
				if now := e.GetStatus().String() + fmt.Sprint(e.GetAttempt()); now != last {
					fmt.Fprintf(out, "execution %s %s attempt %d\n", e.GetId(), e.GetStatus(), e.GetAttempt())
					last = now
				}
			}
			fmt.Fprintln(out, printJSON.Format(e))
			return nil
		},
	}
	cmd.Flags().StringVar(&payload, "payload", "{}", "the request payload, a JSON object")
	cmd.Flags().StringVar(&mode, "mode", "async", "async or sync")
	cmd.Flags().StringVar(&idempotencyKey, "idempotency-key", "", "idempotency key")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the execution settles, printing each change")
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
	cmd := &cobra.Command{Use: "consumer", Short: "Register where the application's events are delivered"}
	set := &cobra.Command{
		Use: "set-webhook URL", Short: "Register a webhook; prints (or writes) its signing secret", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.SetConsumer(ctx, &gatewayv1.SetConsumerRequest{
				Consumer: &gatewayv1.SetConsumerRequest_Webhook{Webhook: &gatewayv1.WebhookConsumer{Url: args[0]}},
			})
			if err != nil {
				return err
			}
			if secretFile != "" {
				if err := os.WriteFile(secretFile, []byte(resp.GetSigningSecret()), 0o600); err != nil {
					return fmt.Errorf("write signing secret: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "webhook %s registered; signing secret written to %s\n", args[0], secretFile)
				return nil
			}
			fmt.Fprintln(cmd.OutOrStdout(), resp.GetSigningSecret())
			return nil
		},
	}
	set.Flags().StringVar(&secretFile, "secret-file", "", "write the signing secret to this file (mode 0600) instead of printing it")
	cmd.AddCommand(set)
	return cmd
}
