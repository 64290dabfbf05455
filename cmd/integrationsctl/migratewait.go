package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/integrations-platform/integrations/pkg/db"
)

// migrateWaitCmd waits until the schema has every migration this binary knows: the init container
// of each service's pod on Kubernetes, so that a service never starts on a schema older than its
// code while the migration Job is still running (docs/decisions.md, "Kubernetes: ordering…").
func migrateWaitCmd(databaseURL *string) *cobra.Command {
	var timeout, interval time.Duration
	cmd := &cobra.Command{
		Use:   "wait",
		Short: "Wait until the schema is at least at this binary's newest migration (applies nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 || interval <= 0 {
				return errors.New("--timeout and --interval must be positive")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			current, err := waitForSchema(ctx, *databaseURL, interval, func(err error) {
				fmt.Fprintln(cmd.ErrOrStderr(), "migrate wait:", err)
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "schema ready at version %d\n", current)
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long, naming the migrations still pending")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "how often to read the schema version")
	return cmd
}

// attemptTimeout bounds one read of the schema's version, so that an unreachable database
// (a blackholed address) is tried again and reported rather than waited on for the whole timeout.
const attemptTimeout = 10 * time.Second

// waitForSchema reads the schema's version every interval until nothing is pending, or ctx ends:
// then it names what was pending (or the last error reading it). A read's error is told to
// report when it differs from the one before.
func waitForSchema(ctx context.Context, url string, interval time.Duration, report func(error)) (int64, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var (
		current int64
		pending []string
		known   bool // a read has succeeded: current and pending are its answer
		lastErr error
	)
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		c, p, err := db.SchemaPending(actx, url)
		cancel()
		switch {
		case ctx.Err() != nil: // a read cut short by the timeout says nothing of the schema
		case err != nil:
			if report != nil && (lastErr == nil || lastErr.Error() != err.Error()) {
				report(err)
			}
			lastErr = err
		case len(p) == 0:
			return c, nil
		default:
			current, pending, known, lastErr = c, p, true, nil
		}
		select {
		case <-ctx.Done():
			if known { // what the schema lacks says more than a read that failed since
				return 0, fmt.Errorf("schema not ready: at version %d, %d migration(s) pending: %s", current, len(pending), strings.Join(pending, ", "))
			}
			return 0, fmt.Errorf("schema not ready: %w", cmp.Or(lastErr, ctx.Err()))
		case <-t.C:
		}
	}
}
