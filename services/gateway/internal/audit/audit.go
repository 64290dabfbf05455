// Package audit is what the gateway's surfaces share about the audit log: through which surface
// an action was asked for, who the operator is in it, and how an entry is written after an action
// that is not one transaction of the store.
//
// An action is audited once, where it is carried out — the server's methods, the system
// functions — whichever surface asked for it: the REST and gRPC API, the system endpoints, or the
// console, which calls the same methods in process and says so in the context (ViaConsole).
package audit

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

type viaKey struct{}

// ViaConsole is ctx as a call the console makes on a signed-in caller's behalf: the audit entry
// the call writes says so.
func ViaConsole(ctx context.Context) context.Context {
	return context.WithValue(ctx, viaKey{}, store.AuditViaConsole)
}

// Via is the surface ctx's call came through: the console if it said so (ViaConsole), the API
// otherwise.
func Via(ctx context.Context) string {
	if v, ok := ctx.Value(viaKey{}).(string); ok {
		return v
	}
	return store.AuditViaAPI
}

// Operator is the admin token in the audit log.
var Operator = store.AuditActor{Role: store.AuditRoleOperator, ID: store.AuditOperator}

// Application is an application's API key in the audit log.
func Application(id string) store.AuditActor {
	return store.AuditActor{Role: store.AuditRoleApplication, ID: id}
}

// Write writes the entry of an action already taken (a settlement, a broker call, a sign-in).
// The action stands even when its entry cannot be written: the failure is logged at error for
// the operator instead. The write does not end with the caller's request.
func Write(ctx context.Context, st *store.Store, logger *zap.Logger, a store.Audit) {
	err := errNoStore
	if st != nil {
		err = st.AuditAppend(context.WithoutCancel(ctx), a)
	}
	if err != nil {
		logger.Error("audit entry not written", zap.String("action", a.Action), zap.String("target", a.Target),
			zap.String("actor_role", a.Who.Role), zap.String("actor", a.Who.ID), zap.String("via", a.Via), zap.Error(err))
	}
}

var errNoStore = errors.New("no audit log configured")
