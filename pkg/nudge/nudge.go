// Package nudge wakes the dispatcher after work was written for it. A nudge is a hint: it is sent
// without making the caller wait, and a lost one is recovered by the dispatcher's scheduled pass.
package nudge

import (
	"context"
	"time"

	"go.uber.org/zap"

	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
)

// timeout bounds one nudge; the dispatcher answers at once.
const timeout = 2 * time.Second

// Dispatcher returns a function that nudges the dispatcher through client in the background. A
// nil client gives a function that does nothing.
func Dispatcher(client dispatcherv1.DispatcherServiceClient, log *zap.Logger) func() {
	if client == nil {
		return func() {}
	}
	return func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			if _, err := client.Nudge(ctx, &dispatcherv1.NudgeRequest{}); err != nil {
				log.Debug("dispatcher nudge lost", zap.Error(err))
			}
		}()
	}
}
