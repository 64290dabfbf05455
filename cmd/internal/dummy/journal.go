package dummy

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// Journal is the dummy adapter's own account of the provider work it did, for fault suites
// (make chaos) that must count work done twice or attempts that never reached the adapter:
// one line per event, appended to a file that outlives the process.
//
// Each line is tab-separated: unix nanoseconds, the adapter's pid, the event, the execution
// id, the attempt, and the event's detail:
//
//	recv  <mode>      Execute was called for this attempt (before any work)
//	done  <outcome>   the work ended: succeeded, permanent (a scripted or script-error
//	                  permanent failure), transient (a scripted transient failure), or
//	                  cancelled (its context ended before the work did: not finished work)
//
// Every line is one write(2) on a file opened with O_APPEND, so concurrent lines never
// interleave, and the kernel keeps what was written when the process is killed with SIGKILL —
// the fault the journal exists for — without an fsync per line (which would only protect
// against losing the machine, and would cap the adapter at the disk's sync rate).
type Journal struct {
	mu  sync.Mutex
	f   *os.File
	pid int
}

// Journal outcomes of a "done" line.
const (
	JournalSucceeded = "succeeded"
	JournalPermanent = "permanent"
	JournalTransient = "transient"
	JournalCancelled = "cancelled"
)

// OpenJournal opens (creating) the journal at path for appending; a nil *Journal, returned for
// an empty path, records nothing.
func OpenJournal(path string) (*Journal, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the dummy adapter's journal: %w", err)
	}
	return &Journal{f: f, pid: os.Getpid()}, nil
}

// record appends one line; a failed write is returned to the caller to log, never fatal: the
// journal is for counting, the adapter's work goes on without it.
func (j *Journal) record(event, executionID string, attempt int32, detail string) error {
	if j == nil {
		return nil
	}
	line := fmt.Sprintf("%d\t%d\t%s\t%s\t%d\t%s\n", time.Now().UnixNano(), j.pid, event, executionID, attempt, detail)
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.f.WriteString(line); err != nil {
		return fmt.Errorf("dummy adapter journal: %w", err)
	}
	return nil
}

// Close closes the journal's file.
func (j *Journal) Close() error {
	if j == nil {
		return nil
	}
	return j.f.Close()
}
