package mq_test

import (
	"testing"

	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/mq/mqtest"
)

// TestContract runs the port's contract suite against RabbitMQ (its Faults: export_test.go).
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

// TestContractSTOMP runs the port's contract suite against the STOMP provider on the ActiveMQ
// of INTEGRATIONS_STOMP_URL (scripts/deps.sh up stomp; make test starts it). It fails, never
// skips, without one. Its Faults: stomp_export_test.go.
func TestContractSTOMP(t *testing.T) {
	t.Parallel()
	mqtest.Run(t, mqtest.Provider{
		Name: mq.ProviderSTOMP,
		New: func(t *testing.T, opts mqtest.Options) mqtest.Env {
			b, faults := mq.NewSTOMPEnv(t, opts.TimeScale)
			return mqtest.Env{Broker: b, Faults: faults}
		},
	})
}
