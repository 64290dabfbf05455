// Package cost reads what a run cost from the servers' own statistics: Postgres transactions and
// WAL (pg_stat_database, pg_stat_wal, the WAL position), RabbitMQ's message counters (the
// broker's global counters, through rabbitmqctl), and each process's peak resident memory.
package cost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PG is a reading of Postgres's counters.
type PG struct {
	Commits, Rollbacks int64 // of the database (pg_stat_database)
	WALBytes           int64 // the WAL position, in bytes (the whole server)
	WALSyncs           int64 // WAL flushes to disk (pg_stat_wal.wal_sync, the whole server)
}

// StatsFlush is how long after a burst Postgres 15 may take to publish a backend's transaction
// counts: an active backend every second, one gone idle within PGSTAT_IDLE_INTERVAL (10 s). Read the
// counters that long after the work to count all of it.
const StatsFlush = 11 * time.Second

// ReadPG reads the counters of the pool's database (see StatsFlush).
func ReadPG(ctx context.Context, pool *pgxpool.Pool) (PG, error) {
	var p PG
	// pg_stat_clear_snapshot: read the live counters, not a snapshot cached by the connection.
	if _, err := pool.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return p, fmt.Errorf("clear statistics snapshot: %w", err)
	}
	err := pool.QueryRow(ctx, `
		SELECT d.xact_commit, d.xact_rollback,
			pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
			(SELECT wal_sync FROM pg_stat_wal)
		FROM pg_stat_database d WHERE d.datname = current_database()`).
		Scan(&p.Commits, &p.Rollbacks, &p.WALBytes, &p.WALSyncs)
	if err != nil {
		return p, fmt.Errorf("read Postgres statistics: %w", err)
	}
	return p, nil
}

// MQ is a reading of the broker's global message counters (all connections, all queues).
type MQ struct {
	Published, Routed, Delivered, Acked, DeadLettered int64
}

// mqExpr sums RabbitMQ's global counters (rabbit_global_counters, RabbitMQ ≥ 3.9).
const mqExpr = `O = rabbit_global_counters:overview(),
P = maps:get([{protocol,amqp091}], O),
Q = [V || {K, V} <- maps:to_list(O), lists:member({protocol,amqp091}, K), length(K) =:= 2],
D = [V || {K, V} <- maps:to_list(O), lists:keymember(dead_letter_strategy, 1, K)],
S = fun(Name, L) -> lists:sum([maps:get(Name, M, 0) || M <- L]) end,
lists:flatten(io_lib:format("~w ~w ~w ~w ~w", [maps:get(messages_received_total, P), maps:get(messages_routed_total, P),
  S(messages_delivered_total, Q), S(messages_acknowledged_total, Q),
  S(messages_dead_lettered_expired_total, D)])).`

// ReadMQ reads the broker's counters with rabbitmqctl ($INTEGRATIONS_RABBITMQCTL, default
// "rabbitmqctl") on the node $INTEGRATIONS_RABBITMQ_NODE (default: rabbitmqctl's own default
// node). For a project-local broker scripts/deps.sh sets both: a plain rabbitmqctl knows
// neither that node's cookie nor its epmd port.
func ReadMQ(ctx context.Context) (MQ, error) {
	bin := os.Getenv("INTEGRATIONS_RABBITMQCTL")
	if bin == "" {
		bin = "rabbitmqctl"
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	args := []string{"-q"}
	if node := os.Getenv("INTEGRATIONS_RABBITMQ_NODE"); node != "" {
		args = append(args, "-n", node)
	}
	out, err := exec.CommandContext(ctx, bin, append(args, "eval", mqExpr)...).CombinedOutput()
	if err != nil {
		return MQ{}, fmt.Errorf("rabbitmqctl eval: %w: %.200s", err, out)
	}
	s := strings.Trim(strings.TrimSpace(string(out)), `"`)
	f := strings.Fields(s)
	if len(f) != 5 {
		return MQ{}, fmt.Errorf("rabbitmqctl eval: unexpected answer %.200q", out)
	}
	var v [5]int64
	for i := range f {
		if v[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return MQ{}, fmt.Errorf("rabbitmqctl eval: unexpected answer %.200q", out)
		}
	}
	return MQ{Published: v[0], Routed: v[1], Delivered: v[2], Acked: v[3], DeadLettered: v[4]}, nil
}

// PeakRSS is a process's peak resident set size in bytes (VmHWM: since it started).
func PeakRSS(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("VmHWM of %d: %w", pid, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}
