package nudge

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
)

type fakeDispatcher struct{ nudged chan struct{} }

func (f fakeDispatcher) Nudge(context.Context, *dispatcherv1.NudgeRequest, ...grpc.CallOption) (*dispatcherv1.NudgeResponse, error) {
	f.nudged <- struct{}{}
	return &dispatcherv1.NudgeResponse{}, nil
}

func TestDispatcherNudgesInTheBackground(t *testing.T) {
	f := fakeDispatcher{nudged: make(chan struct{})} // unbuffered: the nudge blocks until read
	nudge := Dispatcher(f, zap.NewNop())
	nudge() // returns although nobody has read the nudge yet
	select {
	case <-f.nudged:
	case <-time.After(5 * time.Second):
		t.Fatal("the dispatcher was not nudged")
	}
}

func TestDispatcherWithoutClientDoesNothing(t *testing.T) {
	require.NotPanics(t, Dispatcher(nil, zap.NewNop()))
}
