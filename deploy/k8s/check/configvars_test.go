package check

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConfigVarsFollowsNamedAndEmbeddedFields reads the real gateway's variables.
func TestConfigVarsFollowsNamedAndEmbeddedFields(t *testing.T) {
	t.Parallel()
	b := setup(t)
	names := map[string]string{}
	for _, v := range b.vars["gateway"] {
		names[v.Name] = v.Field
	}
	// Embedded from pkg/config, a named field of sdk/go/platformtoken, and the gateway's own.
	require.Equal(t, "config.Common.ShutdownTimeout", names["INTEGRATIONS_SHUTDOWN_TIMEOUT"])
	require.Equal(t, "config.PublicTLS.PublicCertFile", names["INTEGRATIONS_PUBLIC_TLS_CERT_FILE"])
	require.Equal(t, "platformtoken.SignerConfig.SigningKey", names["INTEGRATIONS_PLATFORM_SIGNING_KEY"])
	require.Equal(t, "config.SecretKeys.SecretKey", names["INTEGRATIONS_SECRET_KEY"])
	require.Equal(t, "config.Config.MaxPayloadBytes", names["INTEGRATIONS_MAX_PAYLOAD_BYTES"])
	_, ok := names["INTEGRATIONS_DISPATCH_INTERVAL"]
	require.False(t, ok, "the dispatcher's variable is not the gateway's")
}

// TestConfigVarsResolvesAcrossPackages: a renamed import, a package named unlike its directory,
// envPrefix, a non-repository type (a leaf), and what caarlos0/env skips (an embedded unexported
// type, env:"-") — in a repository of its own, so the rules are pinned even where today's config
// structs do not use them.
func TestConfigVarsResolvesAcrossPackages(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	}
	write("services/svc/internal/config/config.go", `package config

import (
	"time"

	shared "github.com/integrations-platform/integrations/pkg/shared"
	"github.com/integrations-platform/integrations/pkg/dbdir"
)

type Config struct {
	shared.Common
	DB      db.Settings `+"`envPrefix:\"INTEGRATIONS_REPLICA_\"`"+`
	Primary db.Settings
	Own     time.Duration `+"`env:\"INTEGRATIONS_OWN\" envDefault:\"1s\"`"+`
	local
	Skipped string `+"`env:\"-\"`"+`
}

type local struct {
	X string `+"`env:\"INTEGRATIONS_LOCAL,required\"`"+`
}
`)
	write("pkg/shared/shared.go", "package shared\n\ntype Common struct {\n\tA string `env:\"INTEGRATIONS_A\"`\n}\n")
	write("pkg/dbdir/db.go", "package db\n\ntype Settings struct {\n\tURL string `env:\"URL\"`\n}\n")
	vars, err := ConfigVars(root, "svc")
	require.NoError(t, err)
	got := map[string]string{}
	for _, v := range vars {
		got[v.Name] = v.Field
	}
	require.Equal(t, map[string]string{
		"INTEGRATIONS_A":           "shared.Common.A",
		"INTEGRATIONS_REPLICA_URL": "db.Settings.URL",
		"URL":                      "db.Settings.URL",
		"INTEGRATIONS_OWN":         "config.Config.Own",
	}, got, "the embedded unexported local and the env:\"-\" field are not read by env, so not required")

	// Kinds whose rules the reader does not mirror are refused, naming the field.
	for field, want := range map[string]string{
		"P *db.Settings":       "field P: a pointer to a struct",
		"S []db.Settings":      "field S: a slice of structs",
		"I struct{ X string }": "field I: an inline struct type",
	} {
		write("services/svc2/internal/config/config.go", "package config\n\nimport \"github.com/integrations-platform/integrations/pkg/dbdir\"\n\nvar _ db.Settings\n\ntype Config struct {\n\t"+field+"\n}\n")
		_, err = ConfigVars(root, "svc2")
		require.ErrorContains(t, err, want, field)
	}

	// A repository package that does not parse fails the read instead of hiding its variables.
	write("pkg/shared/shared.go", "package shared\n\ntype Common struct {\n")
	_, err = ConfigVars(root, "svc")
	require.ErrorContains(t, err, "shared.go")
}
