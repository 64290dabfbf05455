package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
)

// outputFormats are the values of --output.
const (
	outputText = "text"
	outputJSON = "json"
)

// checkOutput refuses an --output the commands do not know.
func (f *clientFlags) checkOutput() error {
	switch f.output {
	case outputText, outputJSON:
		return nil
	}
	return fmt.Errorf("--output: %q is not text or json", f.output)
}

// writeJSON prints m as JSON (proto field names), one document.
func writeJSON(out io.Writer, m proto.Message) {
	fmt.Fprintln(out, printJSON.Format(m))
}

func timelineCmd(f *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "timeline EXECUTION_ID",
		Short: "Show what happened to an execution, in order: accept, attempts, lease renewals, progress, settlement, events and deliveries",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.checkOutput(); err != nil {
				return err
			}
			client, ctx, done, err := f.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.GetExecutionTimeline(ctx, &gatewayv1.GetExecutionTimelineRequest{Id: args[0]})
			if err != nil {
				return err
			}
			if f.output == outputJSON {
				writeJSON(cmd.OutOrStdout(), resp)
				return nil
			}
			return writeTimeline(cmd.OutOrStdout(), resp)
		},
	}
}

// writeTimeline prints the timeline as a table: time (UTC, ms), time since the accept, kind,
// attempt and the entry's summary.
func writeTimeline(out io.Writer, tl *gatewayv1.GetExecutionTimelineResponse) error {
	fmt.Fprintf(out, "execution %s  %s  %s  application %s\n", tl.GetExecutionId(), tl.GetCapability(),
		strings.TrimPrefix(tl.GetStatus().String(), "EXECUTION_STATUS_"), tl.GetApplicationId())
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TIME\tSINCE ACCEPT\tKIND\tATTEMPT\tWHAT")
	var start time.Time
	for i, e := range tl.GetEntries() {
		at := e.GetAt().AsTime()
		if i == 0 {
			start = at
		}
		attempt := "-"
		if e.GetAttempt() > 0 {
			attempt = fmt.Sprint(e.GetAttempt())
		}
		fmt.Fprintf(w, "%s\t+%s\t%s\t%s\t%s\n", at.UTC().Format("2006-01-02T15:04:05.000Z"), at.Sub(start).Round(time.Millisecond),
			strings.ToLower(strings.TrimPrefix(e.GetKind().String(), "TIMELINE_ENTRY_KIND_")), attempt, oneLine(e.GetSummary()))
	}
	return w.Flush()
}
