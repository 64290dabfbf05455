package riverpeer

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/bench/internal/flagx"
)

// TestMeasure is the measurement behind BestConfig, run only on demand:
//
//	RIVERPEER_MEASURE=1 [RIVERPEER_N=×40] [RIVERPEER_C=1,16,64] \
//	[RIVERPEER_CONFIGS='default;10ms/100ms/0'] \
//	go test -count=1 -run TestMeasure -v -timeout 1h ./bench/internal/riverpeer/
//
// A config is FetchCooldown/FetchPollInterval/PoolSize ("default": River's defaults and
// DefaultPoolSize). RIVERPEER_N may be a number, or "×k" for k jobs per caller (k completer
// cycles: a short run; the default). Below 100 callers a job takes one 250 ms completer cycle, so
// N = 5000 at one caller is a 21-minute run.
func TestMeasure(t *testing.T) {
	if os.Getenv("RIVERPEER_MEASURE") == "" {
		t.Skip("set RIVERPEER_MEASURE=1 to measure")
	}
	ctx := context.Background()
	url := databaseURL()
	schema := freshSchema(t, ctx, url)
	nSpec := flagx.EnvOr("RIVERPEER_N", "×40")
	var concs []int
	for _, s := range strings.Split(flagx.EnvOr("RIVERPEER_C", "1,16,64"), ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			t.Fatal(err)
		}
		concs = append(concs, c)
	}
	for _, spec := range strings.Split(flagx.EnvOr("RIVERPEER_CONFIGS", "default;10ms/100ms/0"), ";") {
		c := parseConfig(t, spec)
		c.DatabaseURL, c.Schema = url, schema
		for _, conc := range concs {
			c.Concurrency = conc
			c.N = jobs(t, nSpec, conc)
			r, err := Run(ctx, c)
			if err != nil {
				t.Fatalf("%s C=%d: %v", spec, conc, err)
			}
			t.Logf("closed %-16s C=%-3d N=%-5d %7.1f jobs/s  p50 %7.1fms p99 %7.1fms max %7.1fms  queue wait p50 %6.1fms complete p50 %6.1fms  errors %d %v",
				spec, conc, c.N, r.Rate(), ms(r.P50), ms(r.P99), ms(r.Max), ms(r.QueueWaitP50), ms(r.CompleteP50), r.Errors, r.FirstErr)
		}
	}
}

func jobs(t *testing.T, spec string, conc int) int {
	if k, ok := strings.CutPrefix(spec, "×"); ok {
		n, err := strconv.Atoi(k)
		if err != nil {
			t.Fatal(err)
		}
		return n * conc
	}
	n, err := strconv.Atoi(spec)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func parseConfig(t *testing.T, spec string) Config {
	if spec == "default" {
		return Config{}
	}
	f := strings.Split(spec, "/")
	if len(f) != 3 {
		t.Fatalf("config %q: want FetchCooldown/FetchPollInterval/PoolSize", spec)
	}
	var c Config
	var err error
	if c.FetchCooldown, err = time.ParseDuration(f[0]); err != nil {
		t.Fatal(err)
	}
	if c.FetchPollInterval, err = time.ParseDuration(f[1]); err != nil {
		t.Fatal(err)
	}
	if c.PoolSize, err = strconv.Atoi(f[2]); err != nil {
		t.Fatal(err)
	}
	return c
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
