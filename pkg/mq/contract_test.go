package mq_test

import (
	"testing"

	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/mq/mqtest"
)

// TestContract runs the port's contract suite against RabbitMQ. The STOMP provider's run goes
// beside this one, with its own New and Faults.
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
