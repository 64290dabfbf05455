// Package procstat reads CPU time from /proc (Linux): of given processes, and of every process
// with a given command name (the Postgres backends, the RabbitMQ node), so that a benchmark can
// say where the CPU went during a run. Elsewhere it reports nothing.
package procstat

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, 100 on every Linux platform Go supports.
const clockTick = 100

// CPU returns the user+system CPU time of pid, false if it cannot be read.
func CPU(pid int) (time.Duration, bool) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	return parseStat(string(raw))
}

// parseStat reads utime and stime (fields 14 and 15) of a /proc/PID/stat line; the command name
// (field 2) is in parentheses and may contain spaces.
func parseStat(s string) (time.Duration, bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+st) * time.Second / clockTick, true
}

// ByName returns the CPU time of every process whose command name (comm) is one of names, by
// name and pid. Diff gives the time spent between two readings.
func ByName(names ...string) map[string]map[int]time.Duration {
	out := map[string]map[int]time.Duration{}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		if !want[name] {
			continue
		}
		if d, ok := CPU(pid); ok {
			if out[name] == nil {
				out[name] = map[int]time.Duration{}
			}
			out[name][pid] = d
		}
	}
	return out
}

// Diff is the CPU time spent between two ByName readings, by name: a process that started in
// between counts from zero; one that ended in between is missed (its time left with it).
func Diff(before, after map[string]map[int]time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pids := range after {
		for pid, a := range pids {
			if d := a - before[name][pid]; d > 0 {
				out[name] += d
			}
		}
	}
	return out
}

// Self is the CPU time of this process.
func Self() time.Duration {
	d, _ := CPU(os.Getpid())
	return d
}
