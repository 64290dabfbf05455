package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// platformKeyCmd makes and reads the key pair that signs the platform's calls to adapters
// (sdk/go/platformtoken): the private key for the gateway and the execution-consumer
// (INTEGRATIONS_PLATFORM_SIGNING_KEY_FILE), the public key for adapters
// (INTEGRATIONS_PLATFORM_PUBLIC_KEYS).
func platformKeyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "platform-key", Short: "Generate or inspect the key that signs the platform's calls to adapters"}
	var privateFile, publicFile string
	generate := &cobra.Command{
		Use:   "generate --private-key FILE [--public-key FILE]",
		Short: "Generate an Ed25519 key pair: the private key into a new file (mode 0600), the public key on stdout",
		Long: "Generate an Ed25519 key pair. The private key is written to --private-key, which must not exist " +
			"(it is never printed); the public key, to give adapters, is printed on stdout and written to " +
			"--public-key if set. The key id that tokens name (kid) is printed on stderr.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if privateFile == "" {
				return errors.New("--private-key: required (the file to write the private key to)")
			}
			pub, priv, err := platformtoken.Generate()
			if err != nil {
				return err
			}
			f, err := os.OpenFile(privateFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("--private-key: %w", err)
			}
			if _, err := fmt.Fprintln(f, platformtoken.EncodePrivateKey(priv)); err != nil {
				_ = f.Close()
				return fmt.Errorf("write private key: %w", err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("write private key: %w", err)
			}
			if publicFile != "" {
				if err := os.WriteFile(publicFile, []byte(platformtoken.EncodePublicKey(pub)+"\n"), 0o644); err != nil {
					return fmt.Errorf("--public-key: %w", err)
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), platformtoken.EncodePublicKey(pub))
			fmt.Fprintf(cmd.ErrOrStderr(), "private key written to %s; key id %s\n", privateFile, platformtoken.KeyID(pub))
			return nil
		},
	}
	generate.Flags().StringVar(&privateFile, "private-key", "", "file to create with the private key (mode 0600)")
	generate.Flags().StringVar(&publicFile, "public-key", "", "file to write the public key to as well")
	var from string
	public := &cobra.Command{
		Use:   "public --private-key FILE",
		Short: "Print the public key and key id of a private key (to hand adapters during a rotation)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := platformtoken.SignerConfig{SigningKeyFile: from}.Signer()
			if err != nil {
				return err
			}
			pub, _ := s.PublicKey()
			fmt.Fprintln(cmd.OutOrStdout(), platformtoken.EncodePublicKey(pub))
			fmt.Fprintf(cmd.ErrOrStderr(), "key id %s\n", s.KeyID())
			return nil
		},
	}
	public.Flags().StringVar(&from, "private-key", "", "the private key file")
	cmd.AddCommand(generate, public)
	return cmd
}
