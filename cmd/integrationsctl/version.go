package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/integrations-platform/integrations/pkg/version"
)

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use: "version", Short: "Print the release this integrationsctl was built from", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.Line("integrationsctl"))
			return err
		},
	}
}
