package db_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestWarnIfAutovacuumOff: the warning follows the server's own setting, read apart from the
// function under test (SHOW), whichever way this server is configured.
func TestWarnIfAutovacuumOff(t *testing.T) {
	t.Parallel()
	s := dbtest.NewEmptySchema(t)
	ctx := context.Background()
	var show string
	require.NoError(t, s.Pool.QueryRow(ctx, `SHOW autovacuum`).Scan(&show))
	require.Contains(t, []string{"on", "off"}, show)

	off, err := db.AutovacuumOff(ctx, s.Pool)
	require.NoError(t, err)
	require.Equal(t, show == "off", off)

	core, logs := observer.New(zapcore.DebugLevel)
	db.WarnIfAutovacuumOff(ctx, s.Pool, zap.New(core))
	warned := logs.FilterLevelExact(zapcore.WarnLevel).Len()
	if show == "off" {
		require.Equal(t, 1, warned, "autovacuum is off: one warning")
	} else {
		require.Zero(t, warned, "autovacuum is on: no warning")
	}
}
