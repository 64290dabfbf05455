// Package nudge wakes the dispatcher after work was written for it. A nudge is a hint: it is sent
// without making the caller wait, and a lost one is recovered by the dispatcher's scheduled pass.
package nudge

import (
	"context"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
)

const timeout = 2 * time.Second

// The states of a Dispatcher nudger.
const (
	idle     = iota // no call in flight
	inFlight        // a call in flight, nothing asked since it was sent
	again           // a call in flight, and a nudge asked since: one more call follows it
)

// Dispatcher returns a function that nudges the dispatcher in the background. Nudges coalesce: at
// most one call is in flight, and nudges asked meanwhile become one more call after it — which
// still follows every write that asked, so the dispatcher's pass after it sees them all. Under load
// that is one call per dispatcher pass instead of one per execution.
func Dispatcher(client dispatcherv1.DispatcherServiceClient, log *zap.Logger) func() {
	if client == nil {
		return func() {}
	}
	var state atomic.Int32
	send := func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			if _, err := client.Nudge(ctx, &dispatcherv1.NudgeRequest{}); err != nil {
				log.Debug("dispatcher nudge lost", zap.Error(err))
			}
			cancel()
			if state.CompareAndSwap(inFlight, idle) {
				return
			}
			state.Store(inFlight) // it was again: send the one more call
		}
	}
	return func() {
		for {
			switch state.Load() {
			case idle:
				if state.CompareAndSwap(idle, inFlight) {
					go send()
					return
				}
			case inFlight:
				if state.CompareAndSwap(inFlight, again) {
					return
				}
			default: // again: the call to come covers this nudge too
				return
			}
		}
	}
}
