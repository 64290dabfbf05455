package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

// devCertsCmd writes a throwaway CA and the services' certificates for development (make run).
func devCertsCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "dev-certs",
		Short: "Write a throwaway CA and one certificate per service (and a client-facing one for localhost), for development",
		Long: `Writes, in --dir, what is missing or expires within a day: ca.pem (the internal CA),
<service>.pem and <service>-key.pem for each of the six services (URI SAN
spiffe://integrations/<service>), and public.pem / public-key.pem for 127.0.0.1, ::1 and
localhost. Existing valid files are kept. Never use them outside this machine.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := devca.Ensure(dir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "dev certificates in %s\n", dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".run/tls", "directory to write to")
	return cmd
}
