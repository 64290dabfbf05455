package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/integrations-platform/integrations/pkg/apikey"
)

// adminFlags are the flags of the commands that call the gateway's operator endpoints.
type adminFlags struct {
	url   string
	token string
	// caFile is the root command's --ca-file: the CA to verify a TLS gateway with ("": the
	// system's roots).
	caFile *string
}

// httpClient is the client for the operator endpoints: verifying a TLS gateway against
// --ca-file when it is given (a gateway on Kubernetes serves the deployment's own CA).
func (f *adminFlags) httpClient() (*http.Client, error) {
	if f.caFile == nil || *f.caFile == "" {
		return http.DefaultClient, nil
	}
	pem, err := os.ReadFile(*f.caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", *f.caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}, nil
}

func (f *adminFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.url, "admin-url", envOr("INTEGRATIONS_GATEWAY_URL", "http://127.0.0.1:8080"),
		"gateway REST base URL, for the operator endpoints (env INTEGRATIONS_GATEWAY_URL)")
	cmd.PersistentFlags().StringVar(&f.token, "admin-token", os.Getenv("INTEGRATIONS_ADMIN_TOKEN"),
		"the deployment's admin token (env INTEGRATIONS_ADMIN_TOKEN)")
}

// call makes an operator request and decodes a 2xx JSON answer into out; any other answer is an
// error carrying the gateway's message.
func (f *adminFlags) call(ctx context.Context, method, path string, body, out any) error {
	if f.token == "" {
		return errors.New("an admin token is required: --admin-token or INTEGRATIONS_ADMIN_TOKEN")
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(f.url, "/")+path, rd)
	if err != nil {
		return fmt.Errorf("--admin-url: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	req.Header.Set("Content-Type", "application/json")
	client, err := f.httpClient()
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(raw))
		}
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, e.Message)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
	}
	return nil
}

// keyInfo is a key as the operator endpoints show it.
type keyInfo struct {
	ID          string     `json:"id"`
	Prefix      string     `json:"prefix"`
	Source      string     `json:"source"`
	Status      string     `json:"status"`
	Description string     `json:"description"`
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at"`
	RevokedAt   *time.Time `json:"revoked_at"`
	LastUsedAt  *time.Time `json:"last_used_at"`
	Key         string     `json:"key"`
}

func keysPath(app string) string {
	return "/api/v1/system/applications/" + url.PathEscape(app) + "/keys"
}

func keysCmd(client *clientFlags) *cobra.Command {
	f := adminFlags{caFile: &client.caFile}
	var app string
	cmd := &cobra.Command{Use: "keys", Short: "Create, list and revoke applications' API keys (operator endpoints, admin token)"}
	f.register(cmd)
	cmd.PersistentFlags().StringVar(&app, "application", "", "the application's id")
	needApp := func() error {
		if app == "" {
			return errors.New("--application is required")
		}
		return nil
	}

	create := keysCreateCmd(&f, &app, needApp)

	list := &cobra.Command{
		Use: "list", Short: "List an application's keys: ids, prefixes and times, never a secret", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needApp(); err != nil {
				return err
			}
			var out struct {
				Keys []keyInfo `json:"keys"`
			}
			if err := f.call(cmd.Context(), http.MethodGet, keysPath(app), nil, &out); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tPREFIX\tSOURCE\tSTATUS\tCREATED\tEXPIRES\tLAST USED\tDESCRIPTION")
			for _, k := range out.Keys {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, or(k.Prefix, "-"), k.Source, k.Status,
					k.CreatedAt.Format(time.RFC3339), timeOr(k.ExpiresAt, "never"), timeOr(k.LastUsedAt, "never"), k.Description)
			}
			return tw.Flush()
		},
	}

	revoke := &cobra.Command{
		Use: "revoke KEY_ID", Short: "Revoke a key: refused on every gateway replica within INTEGRATIONS_GATEWAY_CACHE_TTL", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needApp(); err != nil {
				return err
			}
			var k keyInfo
			if err := f.call(cmd.Context(), http.MethodPost, keysPath(app)+"/"+url.PathEscape(args[0])+":revoke", nil, &k); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "key %s revoked at %s\n", k.ID, timeOr(k.RevokedAt, "?"))
			return nil
		},
	}

	generate := &cobra.Command{
		Use:   "generate",
		Short: "Print a new key without storing it, for a catalog's api_key (bootstrap); needs no gateway",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k, err := apikey.Generate()
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), k.Token)
			return nil
		},
	}
	cmd.AddCommand(create, list, revoke, generate)
	return cmd
}

// keysCreateCmd is keys create: app is the --application flag, read when the command runs.
func keysCreateCmd(f *adminFlags, app *string, needApp func() error) *cobra.Command {
	var description, expiresIn, expiresAt, keyFile string
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a key; prints it (or writes it to --key-file) — the only time it is shown",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needApp(); err != nil {
				return err
			}
			// The key file is made first, new and 0600, so that a key is never created only to be
			// lost (or left readable in an existing file's mode).
			var out *os.File
			if keyFile != "" {
				var err error
				if out, err = createKeyFile(keyFile); err != nil {
					return err
				}
				// For the paths that return early; the written key's Close is checked below.
				defer func() { _ = out.Close() }()
			}
			var k keyInfo
			body := map[string]string{"description": description, "created_by": createdBy(), "expires_in": expiresIn, "expires_at": expiresAt}
			if err := f.call(cmd.Context(), http.MethodPost, keysPath(*app), body, &k); err != nil {
				if out != nil {
					_ = os.Remove(keyFile)
				}
				return err
			}
			exp := "never"
			if k.ExpiresAt != nil {
				exp = k.ExpiresAt.Format(time.RFC3339)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "key %s (%s) created for %s; expires %s\n", k.ID, k.Prefix, *app, exp)
			if keyFile == "" {
				fmt.Fprintln(cmd.OutOrStdout(), k.Key)
				return nil
			}
			if _, err := out.WriteString(k.Key); err != nil {
				return fmt.Errorf("write key %s to %s: %w", k.ID, keyFile, err)
			}
			if err := out.Close(); err != nil {
				return fmt.Errorf("write key %s to %s: %w", k.ID, keyFile, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "key written to %s\n", keyFile)
			return nil
		},
	}
	create.Flags().StringVar(&description, "description", "", "what the key is for")
	create.Flags().StringVar(&expiresIn, "expires-in", "", "expire the key after this long (e.g. 720h)")
	create.Flags().StringVar(&expiresAt, "expires-at", "", "expire the key at this time (RFC 3339)")
	create.Flags().StringVar(&keyFile, "key-file", "", "write the key to this new file (mode 0600; an existing file is refused) instead of printing it")
	return create
}

// createdBy names who creates a key, for the listing: the local user, if known.
func createdBy() string {
	if u := os.Getenv("USER"); u != "" && len(u) <= 64 && apikey.PrintableASCII(u) {
		return "integrationsctl:" + u
	}
	return "integrationsctl"
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func timeOr(t *time.Time, def string) string {
	if t == nil {
		return def
	}
	return t.Format(time.RFC3339)
}

// createKeyFile creates path for a key: new (an existing file, whatever its mode, is refused
// rather than overwritten) and readable by its owner only.
func createKeyFile(path string) (*os.File, error) {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("--key-file %s already exists: give a new file (no key was created)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("--key-file: %w (no key was created)", err)
	}
	return out, nil
}
