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

// gatedDispatcher counts calls and holds each until the test lets it answer.
type gatedDispatcher struct {
	calls  chan struct{}
	answer chan struct{}
}

func (g gatedDispatcher) Nudge(context.Context, *dispatcherv1.NudgeRequest, ...grpc.CallOption) (*dispatcherv1.NudgeResponse, error) {
	g.calls <- struct{}{}
	<-g.answer
	return &dispatcherv1.NudgeResponse{}, nil
}

func TestNudgesWhileOneIsInFlightBecomeOneMoreCall(t *testing.T) {
	g := gatedDispatcher{calls: make(chan struct{}, 10), answer: make(chan struct{})}
	nudge := Dispatcher(g, zap.NewNop())
	await := func(what string) {
		t.Helper()
		select {
		case <-g.calls:
		case <-time.After(5 * time.Second):
			t.Fatal(what)
		}
	}
	nudge()
	await("the first nudge was not sent")
	for range 10 {
		nudge() // while the first call is in flight
	}
	g.answer <- struct{}{} // the first call answers
	await("the nudges asked during the first call were not sent after it")
	require.Empty(t, g.calls, "ten nudges during one call are one more call, not ten")
	g.answer <- struct{}{} // the follow-up answers; nothing is pending any more
	nudge()                // so a new nudge is a new call
	await("a nudge after the follow-up answered was not sent")
	g.answer <- struct{}{}
	require.Empty(t, g.calls)
}
