package grpcx

import "time"

// SetNow sets the clock certificate expiry is checked against, until the returned func restores it.
func SetNow(f func() time.Time) (restore func()) {
	old := now
	now = f
	return func() { now = old }
}
