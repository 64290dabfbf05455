package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Verdict is one row of issue 13's must-show table.
type Verdict struct {
	Name string `json:"name"`
	Want string `json:"want"`
	// Got is the measured figure (unset when Measured is false), Beside what is printed beside it.
	Got      float64 `json:"got"`
	Beside   string  `json:"beside,omitempty"`
	Measured bool    `json:"measured"`
	Pass     bool    `json:"pass"`
}

// Issue 13's targets.
const (
	targetVsRiverSWE2E     = 1.0
	targetPGTxPerExec      = 2.5
	targetMQPerExec        = 1.0
	targetSerialVsRiverSW  = 0.5
	targetMessagesPerRetry = 2.0
)

// findFlow returns the first row of scenario and system (and what containing sub, if given).
func findFlow(rep *Report, scenario, system, sub string, offered float64) (FlowRow, bool) {
	for _, r := range rep.Flow {
		if r.Scenario == scenario && r.System == system && r.Offered == offered && strings.Contains(r.What, sub) &&
			r.PerSecond > 0 && r.Errors <= r.N/100 {
			return r, true
		}
	}
	return FlowRow{}, false
}

// cpuMsPerExec is the CPU per execution in ms of the processes keep selects.
func cpuMsPerExec(c *Cost, keep func(string) bool) (float64, string) {
	var sum float64
	var parts []string
	for _, k := range keys(c.CPUSecondsPer10k) {
		if v := c.CPUSecondsPer10k[k]; keep(k) {
			sum += v
			if v >= 0.05 {
				parts = append(parts, fmt.Sprintf("%s %.2f", k, v/10))
			}
		}
	}
	return round2(sum / 10), strings.Join(parts, ", ")
}

// platformProcess is a process counted in the platform's CPU: Postgres, RabbitMQ and the six
// services (not the dummy adapter or the receiver/load generator, listed apart as for the peer).
func platformProcess(k string) bool {
	return k != "bench" && k != "dummy-adapter" && k != "riversw"
}

// riverSWProcess is a process counted in the same-work peer's CPU: Postgres and its own.
func riverSWProcess(k string) bool { return k == "postgres" || k == "riversw" }

// issue13 computes the must-show table from what was measured.
func issue13(rep *Report) []Verdict {
	var vs []Verdict
	add := func(v Verdict) { vs = append(vs, v) }

	ours, okOurs := findFlow(rep, "e2e/pipelined", "integrations", "", 0)
	sw, okSW := findFlow(rep, "e2e/pipelined", systemRiverSW, "", 0)
	v := Verdict{Name: "e2e pipelined × River same work", Want: fmt.Sprintf("≥ %.1f×", targetVsRiverSWE2E)}
	if okOurs && okSW {
		v.Measured, v.Got = true, round2(ours.PerSecond/sw.PerSecond)
		v.Pass = v.Got >= targetVsRiverSWE2E
		v.Beside = fmt.Sprintf("%.0f/s vs %.0f/s", ours.PerSecond, sw.PerSecond)
	}
	if bare, ok := findFlow(rep, "e2e/pipelined", "river", "best", 0); ok && okOurs {
		v.Beside += fmt.Sprintf("; × River insert → complete only: %.2f (%.0f/s)", ours.PerSecond/bare.PerSecond, bare.PerSecond)
	}
	add(v)

	v = Verdict{Name: "platform CPU ms per execution ≤ River same work's", Want: "≤ River same work"}
	if rep.Cost != nil && rep.RiverSWCost != nil && rep.Cost.Executions > 0 && rep.RiverSWCost.Executions > 0 {
		p, pp := cpuMsPerExec(rep.Cost, platformProcess)
		r, rp := cpuMsPerExec(rep.RiverSWCost, riverSWProcess)
		ad, _ := cpuMsPerExec(rep.Cost, func(k string) bool { return k == "dummy-adapter" })
		rad, _ := cpuMsPerExec(rep.RiverSWCost, func(k string) bool { return k == "dummy-adapter" })
		v.Measured, v.Got, v.Pass = true, p, p <= r
		v.Want = fmt.Sprintf("≤ %.2f", r)
		v.Beside = fmt.Sprintf("platform (%s) vs River (%s); adapter apart: %.2f vs %.2f", pp, rp, ad, rad)
	}
	add(v)

	v = Verdict{Name: "Postgres transactions per execution", Want: fmt.Sprintf("≤ %.1f", targetPGTxPerExec)}
	if rep.Cost != nil && rep.Cost.Executions > 0 {
		v.Measured, v.Got, v.Pass = true, rep.Cost.PGTransactions, rep.Cost.PGTransactions <= targetPGTxPerExec
		if rep.RiverSWCost != nil {
			v.Beside = fmt.Sprintf("River same work: %.2f", rep.RiverSWCost.PGTransactions)
		}
	}
	add(v)

	v = Verdict{Name: "broker messages per execution, nothing failing (max of published, delivered)", Want: fmt.Sprintf("≤ %.0f", targetMQPerExec)}
	switch {
	case rep.Cost != nil && rep.Cost.Port != nil:
		// This stack's own port counters: a message published, and its delivery acknowledged,
		// deferred or retried.
		p := rep.Cost.Port
		pub := p["published"] + p["deferred"] + p["retried"] // copies are publishes too
		del := p["acknowledged"] + p["deferred"] + p["retried"] + p["dead_lettered"]
		v.Measured, v.Got = true, max(pub, del)
		v.Pass = v.Got <= targetMQPerExec
		v.Beside = fmt.Sprintf("this stack's port: published %.2f, settled deliveries %.2f", pub, del)
		if rep.Cost.MQ != nil {
			v.Beside += fmt.Sprintf("; whole broker (neighbours included): published %.2f, delivered %.2f", rep.Cost.MQ["published"], rep.Cost.MQ["delivered"])
		}
	case rep.Cost != nil && rep.Cost.MQ != nil:
		pub, del := rep.Cost.MQ["published"], rep.Cost.MQ["delivered"]
		v.Measured, v.Got = true, max(pub, del)
		v.Pass = v.Got <= targetMQPerExec
		v.Beside = fmt.Sprintf("published %.2f, delivered %.2f, dead-lettered %.2f", pub, del, rep.Cost.MQ["dead_lettered"])
	}
	add(v)

	v = Verdict{Name: "serial p50 × River same work's", Want: fmt.Sprintf("≤ %.1f×", targetSerialVsRiverSW)}
	if a, ok := findFlow(rep, "serial", "integrations", "", 0); ok {
		if b, ok := findFlow(rep, "serial", systemRiverSW, "", 0); ok && b.P50ms > 0 {
			v.Measured, v.Got = true, round2(a.P50ms/b.P50ms)
			v.Pass = v.Got <= targetSerialVsRiverSW
			v.Beside = fmt.Sprintf("p50 %.2f vs %.2f ms, p99 %.2f vs %.2f ms", a.P50ms, b.P50ms, a.P99ms, b.P99ms)
		}
	}
	add(v)

	v = Verdict{Name: "p99 ms at 200/s offered", Want: fmt.Sprintf("≤ %.0f", targetP99At200ms)}
	if a, ok := findFlow(rep, "latency", "integrations", "", 200); ok {
		v.Measured, v.Got, v.Pass = true, a.P99ms, a.P99ms <= targetP99At200ms
		v.Beside = fmt.Sprintf("p50 %.2f ms", a.P50ms)
		if b, ok := findFlow(rep, "latency", systemRiverSW, "", 200); ok {
			v.Beside += fmt.Sprintf("; River same work p50 %.2f / p99 %.2f ms", b.P50ms, b.P99ms)
		}
	}
	add(v)

	v = Verdict{Name: "broker messages per retry (published + dead-lettered)", Want: fmt.Sprintf("≤ %.0f", targetMessagesPerRetry)}
	switch r := rep.Retry; {
	case r != nil && r.PortPerRetry != nil && r.Executions > 0:
		// This stack's own port counters: no other user of the broker counted.
		v.Measured, v.Got, v.Pass = true, r.PortMessagesPerRetry, r.PortMessagesPerRetry <= targetMessagesPerRetry
		v.Beside = fmt.Sprintf("this stack's port, executions route per retry: %s; whole broker (neighbours included): %.2f appended",
			kvText(r.PortPerRetry, "%.2f"), r.MessagesPerRetry)
	case r != nil && r.MQError == "" && r.Executions > 0:
		v.Measured, v.Got, v.Pass = true, r.MessagesPerRetry, r.MessagesPerRetry <= targetMessagesPerRetry
		v.Beside = fmt.Sprintf("%s; with delivered %.2f; ≈ %.0f holding-queue hops (dead-lettered)", kvText(r.PerRetry, "%.2f"), r.AllPerRetry, r.PerRetry["dead_lettered"])
		if rep.Cost == nil || rep.Cost.MQ == nil {
			v.Beside += " (no e2e run to subtract: per execution, its success included)"
		}
	}
	add(v)
	return vs
}

func printIssue13(w io.Writer, vs []Verdict) {
	if len(vs) == 0 {
		return
	}
	fmt.Fprintln(w, "\nIssue 13: what it must show")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "target\twant\tgot\tverdict\tbeside")
	for _, v := range vs {
		got, verdict := "-", "not measured"
		if v.Measured {
			got, verdict = fmt.Sprintf("%.2f", v.Got), passFail(v.Pass)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", v.Name, v.Want, got, verdict, v.Beside)
	}
	tw.Flush() //nolint:errcheck // stdout
}
