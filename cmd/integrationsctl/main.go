// Command integrationsctl administers an integrations deployment: schema migrations and the
// declarative catalog of applications, adapters and capabilities; applications' API keys.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := root().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "integrationsctl:", err)
		os.Exit(1)
	}
}

func root() *cobra.Command {
	var databaseURL string
	cmd := &cobra.Command{
		Use:           "integrationsctl",
		Short:         "Administer an integrations deployment",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.String(),
	}
	cmd.SetVersionTemplate(version.Line("integrationsctl") + "\n")
	cmd.PersistentFlags().StringVar(&databaseURL, "database-url", envOr("INTEGRATIONS_DATABASE_URL",
		"postgres://postgres@127.0.0.1:5432/integrations?sslmode=disable"), "Postgres URL (env INTEGRATIONS_DATABASE_URL)")
	var client clientFlags
	client.register(cmd)
	cmd.AddCommand(migrateCmd(&databaseURL), catalogCmd(&databaseURL),
		invokeCmd(&client), getCmd(&client), listCmd(&client), consumerCmd(&client), eventsCmd(&client), keysCmd(&client))
	cmd.AddCommand(timelineCmd(&client), diagnoseCmd(&client))
	cmd.AddCommand(platformKeyCmd(), devCertsCmd(), healthCmd(), versionCmd(), adapterCmd())
	return cmd
}

func migrateCmd(databaseURL *string) *cobra.Command {
	cmd := &cobra.Command{Use: "migrate", Short: "Apply, roll back or list schema migrations"}
	cmd.AddCommand(
		&cobra.Command{
			Use: "up", Short: "Apply every pending migration", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				results, err := db.Migrate(cmd.Context(), *databaseURL)
				for _, r := range results {
					fmt.Fprintf(cmd.OutOrStdout(), "applied %s (%s)\n", r.Source.Path, r.Duration.Round(1e6))
				}
				if err == nil && len(results) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "schema is up to date")
				}
				return err
			},
		},
		&cobra.Command{
			Use: "down", Short: "Roll back the most recent migration", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				r, err := db.MigrateDown(cmd.Context(), *databaseURL)
				if r != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "rolled back %s\n", r.Source.Path)
				}
				return err
			},
		},
		migrateWaitCmd(databaseURL),
		&cobra.Command{
			Use: "status", Short: "List migrations and whether each is applied", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				st, err := db.MigrationStatus(cmd.Context(), *databaseURL)
				for _, s := range st {
					fmt.Fprintf(cmd.OutOrStdout(), "%-8s %s\n", s.State, s.Source.Path)
				}
				return err
			},
		},
	)
	return cmd
}

func catalogCmd(databaseURL *string) *cobra.Command {
	cmd := &cobra.Command{Use: "catalog", Short: "Check or apply the catalog of applications, adapters and capabilities"}
	// A gateway refuses to start over a weak catalog key unless it listens on loopback only; apply
	// refuses it first, where it is seen in clear, unless told the gateway is a development one.
	var allowWeak bool
	cmd.PersistentFlags().BoolVar(&allowWeak, "allow-weak-keys", false,
		"take api_keys that do not look like 32 random bytes, with a warning: for a gateway that listens on loopback only (make run)")
	cmd.AddCommand(
		&cobra.Command{
			Use: "check FILE", Short: "Validate a catalog file without applying it", Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := catalog.Load(args[0])
				if err != nil {
					return err
				}
				if err := checkWeakKeys(c, allowWeak, cmd.ErrOrStderr()); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "catalog is valid: %d applications, %d adapters, %d capabilities\n",
					len(c.Applications), len(c.Adapters), len(c.Capabilities))
				return nil
			},
		},
		&cobra.Command{
			Use: "apply FILE", Short: "Validate a catalog file and upsert every entry in one transaction", Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := catalog.Load(args[0])
				if err != nil {
					return err
				}
				if err := checkWeakKeys(c, allowWeak, cmd.ErrOrStderr()); err != nil {
					return err
				}
				pool, err := db.Open(cmd.Context(), *databaseURL)
				if err != nil {
					return err
				}
				defer pool.Close()
				var opts []catalog.ApplyOption
				// The key is needed only to create the signing secret of an application that
				// declares a webhook and has none yet; Apply says so if it is.
				if key := os.Getenv("INTEGRATIONS_SECRET_KEY"); key != "" {
					box, err := secret.NewBox("INTEGRATIONS_SECRET_KEY", key, os.Getenv("INTEGRATIONS_SECRET_KEY_PREVIOUS"))
					if err != nil {
						return err
					}
					opts = append(opts, catalog.WithSecretBox(box))
				}
				if err := catalog.Apply(cmd.Context(), pool, c, opts...); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "catalog applied: %d applications, %d adapters, %d capabilities\n",
					len(c.Applications), len(c.Adapters), len(c.Capabilities))
				return nil
			},
		},
	)
	return cmd
}

// checkWeakKeys refuses the catalog's api_keys that do not look like 32 random bytes, naming each
// by its field, application and variables; allowed, it writes each as a warning to w. Apply records
// the verdict either way, for the gateway to read at start.
func checkWeakKeys(c *catalog.Catalog, allow bool, w io.Writer) error {
	weak := c.WeakAPIKeys()
	if allow {
		for _, k := range weak {
			fmt.Fprintf(w, "warning: %s: taken (--allow-weak-keys); a gateway refuses to start with it unless every listener is on loopback\n", k)
		}
		return nil
	}
	errs := make([]error, 0, len(weak))
	for _, k := range weak {
		errs = append(errs, fmt.Errorf("%s: make one with `integrationsctl keys generate`, or pass --allow-weak-keys for a gateway that listens on loopback only", k))
	}
	return errors.Join(errs...)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
