package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/singleflight"
)

// readTimeout bounds a shared read of limits: it runs apart from the context of the call that
// started it, so that one caller giving up does not fail the others waiting on it.
const readTimeout = 5 * time.Second

// Source reads applications' limits from Postgres (applications.invokes_per_second...), filling
// those an application leaves unset with the deployment's defaults. Kept apart from the
// gateway's key lookup (services/gateway/internal/store) so that the accept path's
// authentication stays one cached read and a catalog change of limits takes effect within ttl.
type Source struct {
	pool     *pgxpool.Pool
	defaults Limits
	cache    *expirable.LRU[string, Limits] // nil: read on every call
	reads    singleflight.Group             // one read at a time per application
}

// NewSource reads limits through pool, keeping each for ttl (0: read on every call).
func NewSource(pool *pgxpool.Pool, defaults Limits, ttl time.Duration) *Source {
	s := &Source{pool: pool, defaults: defaults}
	if ttl > 0 {
		s.cache = expirable.NewLRU[string, Limits](10000, nil, ttl)
	}
	return s
}

// Limits returns the application's limits. An application unknown here (removed since it was
// authenticated) gets the defaults. Calls that miss the cache at once — every call of a busy
// application, the moment its entry expires — share one read.
func (s *Source) Limits(ctx context.Context, app string) (Limits, error) {
	if s.cache != nil {
		if l, ok := s.cache.Get(app); ok {
			return l, nil
		}
	}
	ch := s.reads.DoChan(app, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readTimeout)
		defer cancel()
		return s.read(ctx, app)
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return Limits{}, res.Err
		}
		return res.Val.(Limits), nil
	case <-ctx.Done():
		return Limits{}, fmt.Errorf("read rate limits of application %s: %w", app, ctx.Err())
	}
}

// read reads the application's limits and caches them.
func (s *Source) read(ctx context.Context, app string) (Limits, error) {
	var invokes, reads *float64
	var invokeBurst, readBurst *int32
	err := s.pool.QueryRow(ctx, `
		SELECT invokes_per_second, invoke_burst, reads_per_second, read_burst FROM applications WHERE id = $1`,
		app).Scan(&invokes, &invokeBurst, &reads, &readBurst)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Limits{}, fmt.Errorf("read rate limits of application %s: %w", app, err)
	}
	l := s.defaults
	if invokes != nil {
		l.Invoke.PerSecond = *invokes
	}
	if invokeBurst != nil {
		l.Invoke.Burst = int(*invokeBurst)
	}
	if reads != nil {
		l.Read.PerSecond = *reads
	}
	if readBurst != nil {
		l.Read.Burst = int(*readBurst)
	}
	if s.cache != nil {
		s.cache.Add(app, l)
	}
	return l, nil
}
