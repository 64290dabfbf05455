package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/config"
)

func TestValidateSweepInterval(t *testing.T) {
	t.Parallel()
	valid := Config{Common: config.Common{LogLevel: "info", TimeScale: 1, ShutdownTimeout: time.Second,
		Broker: config.BrokerRabbitMQ, AMQPURL: "amqp://guest:guest@127.0.0.1:5672/"},
		InternalTLS: config.InternalTLS{TLSCertFile: "c.pem", TLSKeyFile: "k.pem", TLSCAFile: "ca.pem"}, SweepInterval: time.Second}
	require.NoError(t, valid.Validate())

	for _, d := range []time.Duration{0, -time.Second} {
		c := valid
		c.SweepInterval = d
		require.ErrorContains(t, c.Validate(), "INTEGRATIONS_SWEEP_INTERVAL")
	}

	c := valid
	c.TimeScale = 0
	require.ErrorContains(t, c.Validate(), "INTEGRATIONS_TIME_SCALE", "the shared settings are still checked")
}
