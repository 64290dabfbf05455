package main

import (
	"testing"

	"github.com/integrations-platform/integrations/bench/internal/cost"
)

func verdictOf(t *testing.T, vs []Verdict, name string) Verdict {
	t.Helper()
	for _, v := range vs {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no verdict %q in %+v", name, vs)
	return Verdict{}
}

func TestIssue13(t *testing.T) {
	rep := &Report{
		Flow: []FlowRow{
			{Scenario: "e2e/pipelined", System: "integrations", N: 1000, PerSecond: 600},
			{Scenario: "e2e/pipelined", System: systemRiverSW, N: 1000, PerSecond: 500},
			{Scenario: "e2e/pipelined", System: "river", What: "River best (…)", N: 1000, PerSecond: 1500},
			{Scenario: "serial", System: "integrations", N: 300, PerSecond: 80, P50ms: 10},
			{Scenario: "serial", System: systemRiverSW, N: 300, PerSecond: 30, P50ms: 30},
			// a River row with too many errors does not count
			{Scenario: "latency", System: "integrations", Offered: 200, N: 4000, PerSecond: 199, P50ms: 20, P99ms: 120},
		},
		// CPU s per 10k: platform 10 + 5 + 3 = 18 → 1.8 ms (adapter and bench apart); River 12 + 9 → 2.1 ms.
		Cost: &Cost{Executions: 1000, PGTransactions: 2.4, CPUSecondsPer10k: map[string]float64{
			"postgres": 10, "beam.smp": 5, "gateway": 3, "dummy-adapter": 4, "bench": 7}, MQ: map[string]float64{"published": 1, "delivered": 1.2}},
		RiverSWCost: &Cost{Executions: 1000, PGTransactions: 2.3, CPUSecondsPer10k: map[string]float64{
			"postgres": 12, "riversw": 9, "gateway": 0.5, "beam.smp": 0.2, "dummy-adapter": 4, "bench": 3}},
		Retry: &RetryResult{Executions: 10, MessagesPerRetry: 2, PerRetry: map[string]float64{"published": 1, "dead_lettered": 1, "delivered": 1}},
	}
	vs := issue13(rep)
	if len(vs) != 7 {
		t.Fatalf("%d verdicts, want 7", len(vs))
	}
	check := func(name string, got float64, pass bool) {
		t.Helper()
		v := verdictOf(t, vs, name)
		if !v.Measured || v.Got != got || v.Pass != pass {
			t.Errorf("%s: measured %v got %v pass %v, want got %v pass %v (%s)", name, v.Measured, v.Got, v.Pass, got, pass, v.Beside)
		}
	}
	check("e2e pipelined × River same work", 1.2, true)
	check("platform CPU ms per execution ≤ River same work's", 1.8, true)
	check("Postgres transactions per execution", 2.4, true)
	check("broker messages per execution, nothing failing (max of published, delivered)", 1.2, false)
	check("serial p50 × River same work's", 0.33, true)
	check("p99 ms at 200/s offered", 120, false)
	check("broker messages per retry (published + dead-lettered)", 2, true)

	// Nothing measured: every verdict says so rather than passing.
	for _, v := range issue13(&Report{}) {
		if v.Measured || v.Pass {
			t.Errorf("%s: measured %v pass %v on an empty report", v.Name, v.Measured, v.Pass)
		}
	}
}

func TestPerRetry(t *testing.T) {
	before := cost.MQ{Published: 100, Routed: 100, Delivered: 100, Acked: 100, DeadLettered: 10}
	// 10 executions, each: its nothing-fails cost (1 published, 1 delivered) plus a one-hop retry
	// (1 published into the holding queue, 1 dead-lettered into the work queue, 1 delivered).
	after := cost.MQ{Published: 120, Routed: 120, Delivered: 120, Acked: 120, DeadLettered: 20}
	base := &Cost{MQ: map[string]float64{"published": 1, "routed": 1, "delivered": 1, "acknowledged": 1}}
	perExec, per, appended, all := perRetry(before, after, 10, base)
	if perExec["published"] != 2 || perExec["dead_lettered"] != 1 {
		t.Errorf("per execution %v", perExec)
	}
	if per["published"] != 1 || per["dead_lettered"] != 1 || per["delivered"] != 1 || appended != 2 || all != 3 {
		t.Errorf("per retry %v, appended %v, all %v; want 1 published, 1 dead-lettered, 1 delivered, 2 appended, 3 in all", per, appended, all)
	}
	// Without a nothing-fails run nothing is subtracted.
	if _, per, appended, _ := perRetry(before, after, 10, nil); per["published"] != 2 || appended != 3 {
		t.Errorf("without base: per retry %v, appended %v", per, appended)
	}
}
