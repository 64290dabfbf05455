package catalog

import (
	"cmp"
	"context"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// RateLimits are an application's own limits (issue 11): invokes (InvokeCapability) and reads
// (every other GatewayService call) each pass a token bucket of a rate per second and a burst.
// A field left out takes the deployment's default (INTEGRATIONS_RATE_LIMIT_*); a rate of 0 is
// unlimited. The limits are declarative: an application that declares none goes back to the
// defaults when the catalog is applied.
type RateLimits struct {
	InvokesPerSecond *float64 `yaml:"invokes_per_second"`
	InvokeBurst      *int     `yaml:"invoke_burst"`
	ReadsPerSecond   *float64 `yaml:"reads_per_second"`
	ReadBurst        *int     `yaml:"read_burst"`
}

// Bounds of the rate limits. A rate above MaxRatePerSecond is no limit on one gateway; a burst
// above MaxBurst would let one application hold the gateway for seconds; a rate below
// MinRatePerSecond (one call in about 17 minutes), other than 0, is a typing error rather than
// a limit, and would advise absurd delays.
const (
	MinRatePerSecond = 0.001
	MaxRatePerSecond = 1_000_000
	MaxBurst         = 1_000_000
)

// CheckRate returns the problem of a rate per second, if any: it must be 0 (unlimited) or
// between MinRatePerSecond and MaxRatePerSecond. The message starts with the value.
func CheckRate(v float64) string {
	if math.IsNaN(v) || v < 0 || v > MaxRatePerSecond || (v > 0 && v < MinRatePerSecond) {
		return fmt.Sprintf("%v must be 0 (unlimited) or between %v and %d per second", v, MinRatePerSecond, MaxRatePerSecond)
	}
	return ""
}

// checkRateLimits returns the problems of r, each starting with the field at fault
// ("invoke_burst: ...").
func checkRateLimits(r *RateLimits) []string {
	if r == nil {
		return nil
	}
	var bad []string
	rate := func(field string, v *float64) {
		if v == nil {
			return
		}
		if problem := CheckRate(*v); problem != "" {
			bad = append(bad, field+": "+problem)
		}
	}
	burst := func(field string, v *int) {
		if v != nil && (*v < 1 || *v > MaxBurst) {
			bad = append(bad, fmt.Sprintf("%s: %d must be between 1 and %d", field, *v, MaxBurst))
		}
	}
	rate("invokes_per_second", r.InvokesPerSecond)
	burst("invoke_burst", r.InvokeBurst)
	rate("reads_per_second", r.ReadsPerSecond)
	burst("read_burst", r.ReadBurst)
	return bad
}

// applyRateLimits stores the application's limits; nil (none declared) stores the defaults (NULL).
func applyRateLimits(ctx context.Context, tx pgx.Tx, appID string, r *RateLimits) error {
	r = cmp.Or(r, &RateLimits{})
	if _, err := tx.Exec(ctx, `
		UPDATE applications SET invokes_per_second = $2, invoke_burst = $3, reads_per_second = $4, read_burst = $5
		WHERE id = $1`, appID, r.InvokesPerSecond, r.InvokeBurst, r.ReadsPerSecond, r.ReadBurst); err != nil {
		return fmt.Errorf("apply rate limits of application %s: %w", appID, err)
	}
	return nil
}
