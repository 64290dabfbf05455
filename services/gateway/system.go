package main

import (
	"time"

	"github.com/integrations-platform/integrations/pkg/service"
	svcconfig "github.com/integrations-platform/integrations/services/gateway/internal/config"
	"github.com/integrations-platform/integrations/services/gateway/internal/system"
)

// systemConfig is the operator endpoints' (/api/v1/system/: diagnostic, dead letters, keys),
// opened by the admin token; the console's operator view serves them too.
func systemConfig(k *service.Kit, cfg svcconfig.Config, a *api) system.Config {
	return system.Config{
		AdminToken: cfg.AdminToken,
		Keys:       a.store,
		// The gateway holds no broker connection: the endpoints that need one dial it per request,
		// so that a broker outage never stops the gateway from accepting executions.
		Broker:   k.BrokerConfig(),
		Timeout:  2 * time.Second,
		Logger:   k.Log,
		Failures: a.fails,
	}
}
