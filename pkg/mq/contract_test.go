package mq_test

import (
	"testing"

	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/mq/mqtest"
)

// TestContract runs the port's contract suite against RabbitMQ (its Faults: export_test.go).
//
// The STOMP provider's run goes beside this one, as a second mqtest.Run with Name
// mq.ProviderSTOMP: a New that dials mq.Config{Provider: mq.ProviderSTOMP, URL:
// $INTEGRATIONS_STOMP_URL (ActiveMQ started by scripts/deps.sh up stomp), Scope: a fresh one}
// and deletes the scope's destinations at the end, and Faults over the STOMP client's
// connections (a test hook of that provider, as RabbitMQ's wrapConn): Depth from outside the
// port, CutConsuming and TearDownOnNextSettle on the consuming socket, WithholdCopyConfirm and
// WithholdPublishConfirms by withholding RECEIPT frames, RefuseNextSettle by an ACK of a
// delivery the broker no longer holds (its ERROR frame).
func TestContract(t *testing.T) {
	t.Parallel()
	mqtest.Run(t, mqtest.Provider{
		Name: mq.ProviderRabbitMQ,
		New: func(t *testing.T, opts mqtest.Options) mqtest.Env {
			b, faults := mq.NewRabbitEnv(t, opts.TimeScale)
			return mqtest.Env{Broker: b, Faults: faults}
		},
	})
}
