package execution_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/execution"
)

// TestTransitions lists every transition the services apply, each as its (from → to) moves: the
// lifecycle as a table. A transition added, removed or rerouted changes this table.
func TestTransitions(t *testing.T) {
	t.Parallel()
	require.Equal(t, map[string][]string{
		"accept":      {"(new) → pending"},
		"accept sync": {"(new) → running"},
		"withdraw":    {"running → (deleted)"},
		"start":       {"pending → running"},
		"undo":        {"running → pending"},
		"renew":       {"running → running"},
		"progress":    {"running → running"},
		"settle":      {"running → succeeded", "running → failed"},
		"retry":       {"running → pending"},
		"exhaust":     {"running → failed"},
		"sweep":       {"running → pending", "running → failed"},
		"strand":      {"pending → failed"},
		"cancel":      {"pending → cancelled", "running → cancelled"},
	}, moves(execution.Transitions))
	require.Equal(t, map[string][]string{
		"event create":     {"(new) → pending"},
		"event claim":      {"pending → pending"},
		"event deliver":    {"pending → delivered"},
		"event retry":      {"pending → pending"},
		"event die":        {"pending → dead"},
		"event redeliver":  {"pending → pending", "delivered → pending", "dead → pending"},
		"event superseded": {"pending → pending"},
	}, moves(execution.EventTransitions))

	// No settled execution moves again, and every status is reached.
	reached := map[execution.Status]bool{}
	for _, tr := range execution.Transitions {
		for _, f := range tr.From {
			require.False(t, f.IsFinal(), "%s leaves the settled status %s", tr.Name, f)
		}
		for _, to := range tr.To {
			reached[to] = true
		}
	}
	for _, s := range []execution.Status{execution.StatusPending, execution.StatusRunning, execution.StatusSucceeded, execution.StatusFailed, execution.StatusCancelled} {
		require.True(t, reached[s], "%s is reached by a transition", s)
	}
}

// moves lists each transition's (from → to) moves.
func moves[S execution.Status | execution.EventStatus](ts []execution.Transition[S]) map[string][]string {
	out := map[string][]string{}
	for _, tr := range ts {
		from := tr.From
		if len(from) == 0 {
			from = []S{"(new)"}
		}
		to := tr.To
		if len(to) == 0 {
			to = []S{"(deleted)"}
		}
		for _, f := range from {
			for _, to := range to {
				out[tr.Name] = append(out[tr.Name], string(f)+" → "+string(to))
			}
		}
	}
	return out
}

func TestTransitionSQL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "e.status = 'pending'", execution.Start.FromSQL("e.status"))
	require.Equal(t, "status IN ('pending', 'running')", execution.Cancel.FromSQL("status"))
	require.Equal(t, "'running'", execution.Start.ToSQL())
	require.Panics(t, func() { execution.Settle.ToSQL() }, "two targets: the caller names one")
	require.Panics(t, func() { execution.Accept.FromSQL("status") }, "no source")
}

// statusLiteral is a status written as a SQL string literal in Go source.
var statusLiteral = regexp.MustCompile(`'(pending|running|succeeded|failed|cancelled|delivered|dead)'`)

// TestNoStatusLiteralsOutsideTheLifecycle: the services' and the shared packages' code names an
// execution's or an event's status only through this package (its constants, Literal, and the
// transitions' FromSQL/ToSQL), never as a literal of its own, so that every status change is
// found by its transition. Tests may write literals; migrations are SQL and state the schema.
func TestNoStatusLiteralsOutsideTheLifecycle(t *testing.T) {
	t.Parallel()
	var found []string
	for _, root := range []string{"../../services", "../../pkg"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path == "../../pkg/execution" || path == "../../pkg/gen" || d.Name() == "testdata" || d.Name() == "node_modules" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(src), "\n") {
				if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, "//") || strings.HasPrefix(trimmed, "--") {
					continue
				}
				if m := statusLiteral.FindString(line); m != "" {
					found = append(found, path+":"+itoa(i+1)+": "+m)
				}
			}
			return nil
		})
		require.NoError(t, err)
	}
	sort.Strings(found)
	require.Empty(t, found, "status literals outside pkg/execution: use the lifecycle's transitions (FromSQL, ToSQL) or Literal")
}

func itoa(n int) string { return strconv.Itoa(n) }
