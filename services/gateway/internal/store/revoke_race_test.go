package store

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestConcurrentRevokesAuditOneRevocation: two revocations of one key racing write one audit
// entry saying it was revoked and one saying it was revoked already, as they would one after the
// other. The statement once read whether the key was revoked from its snapshot while its UPDATE
// waited for the other revocation's lock and then kept that one's time: both entries said the
// key was not revoked already. Each round starts both at once.
func TestConcurrentRevokesAuditOneRevocation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)

	const rounds = 300
	for round := range rounds {
		key, _, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp})
		require.NoError(t, err)
		a := &Audit{Who: AuditActor{Role: AuditRoleOperator, ID: AuditOperator}, Via: AuditViaAPI,
			Action: "api_key.revoke", Target: dbtest.TestApp, Detail: map[string]any{"key_id": key.ID}}

		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			errs  [2]error
		)
		for i := range errs {
			wg.Go(func() {
				<-start
				_, errs[i] = st.RevokeKey(ctx, dbtest.TestApp, key.ID, a)
			})
		}
		close(start)
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])

		var fresh, already int
		require.NoError(t, s.Pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE NOT (detail->>'already_revoked')::bool),
				count(*) FILTER (WHERE (detail->>'already_revoked')::bool)
			FROM console_audit WHERE detail->>'key_id' = $1`, key.ID).Scan(&fresh, &already))
		require.Equal(t, [2]int{1, 1}, [2]int{fresh, already},
			"round %d: the audit entries of two revocations of key %s: [not already, already]", round, key.ID)
	}
}
