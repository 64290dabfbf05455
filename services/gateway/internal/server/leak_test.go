package server_test

import (
	"testing"

	"github.com/integrations-platform/integrations/pkg/leaktest"
)

// The package's tests make the gateway's caches, whose purge goroutines outlive them (leaktest).
func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }
