package mq_test

import (
	"testing"

	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/mq/mqtest"
)

// TestContract runs the port's contract suite against RabbitMQ.
func TestContract(t *testing.T) {
	t.Parallel()
	contract(t, mq.ProviderRabbitMQ, mq.NewRabbitEnv)
}

// TestContractSTOMP runs the port's contract suite against the STOMP provider on the ActiveMQ
// of INTEGRATIONS_STOMP_URL (scripts/deps.sh up stomp; make test starts it). It fails, never
// skips, without one.
func TestContractSTOMP(t *testing.T) {
	t.Parallel()
	contract(t, mq.ProviderSTOMP, mq.NewSTOMPEnv)
}

// contract runs the suite with a provider's Broker and its Faults (export_test.go).
func contract(t *testing.T, name string, newEnv func(*testing.T, float64) (mq.Broker, *mq.Faults)) {
	mqtest.Run(t, mqtest.Provider{Name: name, New: func(t *testing.T, opts mqtest.Options) mqtest.Env {
		b, faults := newEnv(t, opts.TimeScale)
		return mqtest.Env{Broker: b, Faults: faults}
	}})
}
