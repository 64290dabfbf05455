package dbtest

import "testing"

// SetNoReuse makes NewSchema drop every schema at the end of its test (as it did before schemas
// were reused), and returns the setting to restore.
func SetNoReuse(v bool) (restore func()) {
	old := noReuse
	noReuse = v
	return func() { noReuse = old }
}

// Reusable is how many emptied schemas wait for reuse.
func Reusable() int {
	reuse.mu.Lock()
	defer reuse.mu.Unlock()
	return len(reuse.free)
}

// Scope stands for one test: NewSchemaIn makes its schema, Close runs its clean-ups (in reverse).
type Scope struct {
	testing.TB
	cleanups []func()
}

func (s *Scope) Cleanup(f func()) { s.cleanups = append(s.cleanups, f) }

// Close ends the scope's test.
func (s *Scope) Close() {
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		s.cleanups[i]()
	}
	s.cleanups = nil
}

// NewSchemaIn is NewSchema for the test sc stands for.
func NewSchemaIn(sc *Scope) *Schema { return newSchema(sc, true) }
