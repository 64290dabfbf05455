package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// diagnosePath is the gateway's broker diagnostic (services/gateway/internal/system).
const diagnosePath = "/api/v1/system/mq-diagnostic"

// diagnosis is diagnose's --output json: the diagnostic's lines (one per route) and whether
// every route passed.
type diagnosis struct {
	OK         bool     `json:"ok"`
	StatusCode int      `json:"status_code"`
	Lines      []string `json:"lines"`
}

func diagnoseCmd(client *clientFlags) *cobra.Command {
	f := adminFlags{caFile: &client.caFile}
	cmd := &cobra.Command{
		Use:   "diagnose",
		Short: "Run the gateway's broker diagnostic: a publish + consume round trip per route, queue depths, counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := client.checkOutput(); err != nil {
				return err
			}
			d, err := f.diagnose(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if client.output == outputJSON {
				b, err := json.MarshalIndent(d, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintln(out, string(b))
			} else {
				for _, l := range d.Lines {
					fmt.Fprintln(out, l)
				}
			}
			if !d.OK {
				return fmt.Errorf("broker diagnostic failed (HTTP %d)", d.StatusCode)
			}
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

// diagnose POSTs to the diagnostic and reads its text answer, which it gives with 200 when every
// route passed and 503 when one did not.
func (f *adminFlags) diagnose(ctx context.Context) (*diagnosis, error) {
	if f.token == "" {
		return nil, errors.New("an admin token is required: --admin-token or INTEGRATIONS_ADMIN_TOKEN")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(f.url, "/")+diagnosePath, nil)
	if err != nil {
		return nil, fmt.Errorf("--admin-url: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	client, err := f.httpClient()
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		return nil, fmt.Errorf("POST %s: %d %s", diagnosePath, resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	d := &diagnosis{OK: resp.StatusCode == http.StatusOK, StatusCode: resp.StatusCode, Lines: []string{}}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if l != "" {
			d.Lines = append(d.Lines, l)
		}
	}
	return d, nil
}
