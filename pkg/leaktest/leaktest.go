// Package leaktest is the goroutine-leak check of a test package whose tests start goroutines of
// a third-party library that outlive every test by design: goleak, with the one list of those
// goroutines and why each may stay. A package whose tests start none calls goleak directly; its
// check stays the strictest.
package leaktest

import (
	"testing"

	"go.uber.org/goleak"
)

// ignores are the goroutines a test may leave behind: each of a library, each unstoppable by the
// library's own design, each started once per process in production.
var ignores = []goleak.Option{
	// golang-lru's expirable cache starts a goroutine per cache, to purge expired entries, and
	// never stops it: its done channel is never closed ("it's decided to add functionality to
	// close it in the version later than v2", expirable_lru.go, v2.0.7). The gateway makes its
	// caches once at start (store.WithCache, ratelimit.NewSource); its tests make one per store.
	goleak.IgnoreTopFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"),
}

// VerifyTestMain runs the package's tests (call it from TestMain) and then fails the run if any
// goroutine other than the ignored ones is left.
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	goleak.VerifyTestMain(m, append(append([]goleak.Option{}, ignores...), opts...)...)
}
