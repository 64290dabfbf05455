package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// Replicas counts the live gateway replicas through a heartbeat table (gateway_replicas): each
// replica upserts its row every interval and counts the rows seen within staleAfter (three
// intervals), deleting older ones. The count is read from memory on every call, so the limiter
// costs no round trip on accept; a replica that joins is counted by the others within an interval,
// one that died stops being counted within staleAfter (meanwhile the others admit a little less,
// never more).
//
// A beat is bounded by an interval. When beats fail the count errs high, never low, since the
// others stop counting this replica after staleAfter and take up its share: failures within
// staleAfter keep the last count; past it the count is raised to the last count + 1 (the others'
// shares have grown; this one shrinks). A replica whose first beat failed — it knows nothing of
// the fleet — counts 2 rather than holding the whole limit.
type Replicas struct {
	pool       *pgxpool.Pool
	id         string
	interval   time.Duration
	staleAfter time.Duration
	log        *zap.Logger
	now        func() time.Time
	live       atomic.Int64

	mu        sync.Mutex // beats: Beat is called by Run and once at startup
	lastOK    time.Time  // of the last beat that succeeded; zero: none yet
	lastCount int64
}

// NewReplicas returns this replica's heartbeat, beating every interval. Until the first beat the
// replica counts itself alone.
func NewReplicas(pool *pgxpool.Pool, interval time.Duration, log *zap.Logger) *Replicas {
	r := &Replicas{pool: pool, id: replicaID(), interval: interval, staleAfter: 3 * interval, log: log, now: time.Now}
	r.live.Store(1)
	return r
}

// replicaID is unique per process: the host name (a pod's name) and a random suffix, so that a
// restarted pod is a new replica and never takes over a row another process still beats.
func replicaID() string {
	host, _ := os.Hostname()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	if len(host) > 64 {
		host = host[:64]
	}
	return host + "-" + hex.EncodeToString(b)
}

// Count is the number of live replicas, this one included (at least 1).
func (r *Replicas) Count() int { return int(r.live.Load()) }

// Beat records this replica alive and recounts the live ones, in one statement, within an
// interval. When it fails the count is kept or raised (see Replicas).
func (r *Replicas) Beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.interval)
	defer cancel()
	var others int64
	// The statement's parts see the table as it was before it: the count is of the others.
	err := r.pool.QueryRow(ctx, `
		WITH beat AS (
			INSERT INTO gateway_replicas (id, last_seen) VALUES ($1, now())
			ON CONFLICT (id) DO UPDATE SET last_seen = now()
		), gone AS (
			DELETE FROM gateway_replicas WHERE last_seen < now() - make_interval(secs => $2) AND id <> $1
		)
		SELECT count(*) FROM gateway_replicas WHERE last_seen >= now() - make_interval(secs => $2) AND id <> $1`,
		r.id, r.staleAfter.Seconds()).Scan(&others)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		switch {
		case r.lastOK.IsZero():
			r.live.Store(max(r.live.Load(), 2))
		case r.now().Sub(r.lastOK) > r.staleAfter:
			r.live.Store(max(r.live.Load(), r.lastCount+1))
		}
		return fmt.Errorf("gateway replica heartbeat: %w", err)
	}
	r.lastOK, r.lastCount = r.now(), others+1
	r.live.Store(others + 1)
	return nil
}

// Run beats every interval until ctx ends, then removes this replica's row so that the others
// take up its share at once.
func (r *Replicas) Run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := r.Leave(context.WithoutCancel(ctx)); err != nil {
				r.log.Warn("leave gateway replicas", zap.Error(err))
			}
			return
		case <-t.C:
			if err := r.Beat(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("rate limit share kept or shrunk: replica count not refreshed", zap.Int("replicas", r.Count()), zap.Error(err))
			}
		}
	}
}

// Leave removes this replica's row.
func (r *Replicas) Leave(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := r.pool.Exec(ctx, `DELETE FROM gateway_replicas WHERE id = $1`, r.id); err != nil {
		return fmt.Errorf("remove gateway replica %s: %w", r.id, err)
	}
	return nil
}
