package main

import (
	"net/http"

	"github.com/integrations-platform/integrations/pkg/service"
	svcconfig "github.com/integrations-platform/integrations/services/gateway/internal/config"
	"github.com/integrations-platform/integrations/services/gateway/internal/console"
	"github.com/integrations-platform/integrations/services/gateway/internal/system"
)

// consoleHandler is the console (/console/). It calls the API directly with the signed-in
// caller's identity: it checks its session itself, and the API's methods apply the caller's
// tenancy as to any API call.
func consoleHandler(k *service.Kit, cfg svcconfig.Config, a *api, sys system.Config) (http.Handler, error) {
	return console.Handler(console.Config{
		API: a.gw, Store: a.store, Box: k.Box, AdminToken: cfg.AdminToken, System: sys,
		Secure: k.Public != nil, SessionTTL: cfg.ConsoleSessionTTL, Logger: k.Log, Failures: a.fails,
	})
}
