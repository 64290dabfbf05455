// Package dummy is the reference adapter: capability dummy.echo echoes its payload, and an
// optional "dummy" object in the payload scripts how the attempt behaves, so that tests and
// demos can drive every path of the flow (docs/architecture.md §7):
//
//	{"dummy": {"fail_transient": 2, "retry_after_ms": 500}}  attempts 1..2 fail transient, 3 succeeds
//	{"dummy": {"fail_permanent": true}}                      fails permanent
//	{"dummy": {"sleep_ms": 200}}                             sleeps before answering
//	{"dummy": {"complete_later_ms": 3000, "lease_ms": 1000}} answers Accepted, reports 50% half way,
//	                                                         completes through the callback API
//	{"dummy": {"hang": true}}                                never answers
//	{"dummy": {"hang": true, "only_attempts": 1}}            the script applies to attempts 1..1
//	                                                         only; later attempts echo
//	{"dummy": {"result_nul": true}}                          the echo's result holds a NUL
//	                                                         character (a result the platform
//	                                                         refuses: the hostile-input suite)
//	{"dummy": {"result_depth": 70}}                          the echo's result is nested 70 deep
//	{"dummy": {"progress_nul": true, "complete_later_ms": 100}}  the progress report holds a NUL
//	{"dummy": {"complete_later_ms": 1000, "progress_steps": 4}}  reports progress 4 times, evenly
//	                                                         spread ({"percent": 20, "step": 1},
//	                                                         ... 80, 4), instead of 50% half way;
//	                                                         0: no report
//
// Keys may be combined: sleep_ms applies first, then the first of hang, fail_permanent,
// fail_transient (while attempts remain) and complete_later_ms that is set; otherwise the echo.
// Key names may be added, never changed: scripts depend on them.
package dummy

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	plog "github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
)

// Capability is the dummy adapter's capability. It also serves every other capability named
// "dummy.<something>" the same way, so that a catalog can give the same behaviour other
// schedules (retry delays, ceilings, budgets) under other names.
const Capability = "dummy.echo"

// capabilityPrefix names the capabilities the dummy adapter serves.
const capabilityPrefix = "dummy."

// ScriptKey is the payload key holding the script; it is left out of the echo.
const ScriptKey = "dummy"

// DefaultLease is the lease of complete_later work without lease_ms.
const DefaultLease = 5 * time.Second

// script is the parsed "dummy" object.
type script struct {
	failTransient   int
	retryAfter      time.Duration
	failPermanent   bool
	sleep           time.Duration
	completeLater   time.Duration
	hasCompleteLate bool
	lease           time.Duration
	hang            bool
	// onlyAttempts, when positive, limits the script to attempts 1..onlyAttempts.
	onlyAttempts int
	// resultNUL, resultDepth and progressNUL make the answer one the platform must refuse.
	resultNUL   bool
	resultDepth int
	progressNUL bool
	// progressSteps, when hasProgressSteps, is how many progress reports complete_later work
	// makes, evenly spread over it; otherwise it reports 50% half way.
	progressSteps    int
	hasProgressSteps bool
}

// behaviour names what the attempt will do, for the log.
func (s script) behaviour(attempt int32) string {
	switch {
	case s.hang:
		return "hang"
	case s.failPermanent:
		return "fail_permanent"
	case int(attempt) <= s.failTransient:
		return "fail_transient"
	case s.hasCompleteLate:
		return "complete_later"
	case s.sleep > 0:
		return "sleep"
	}
	return "echo"
}

// NewHandler returns the dummy adapter's handler, recording every attempt it receives and every
// piece of work it finishes in j (nil: no journal).
func NewHandler(log *zap.Logger, j *Journal) adapter.Handler {
	return func(ctx context.Context, req *adapter.Request) adapter.Result {
		if err := j.record("recv", req.ExecutionID, req.Attempt, req.Mode); err != nil {
			log.Warn("journal write failed", zap.Error(err))
		}
		done := func(outcome string) {
			if err := j.record("done", req.ExecutionID, req.Attempt, outcome); err != nil {
				log.Warn("journal write failed", zap.Error(err))
			}
		}
		fields := []zap.Field{plog.ExecutionID(req.ExecutionID), plog.Attempt(req.Attempt), zap.String("mode", req.Mode)}
		if !strings.HasPrefix(req.Capability, capabilityPrefix) {
			log.Warn("execute refused", append(fields, zap.String("behaviour", "unknown_capability"), zap.String("capability", req.Capability))...)
			done(JournalPermanent)
			return adapter.Fail(adapter.ClassPermanent, "unknown_capability", fmt.Sprintf("the dummy adapter serves %s and other dummy.* capabilities, not %q", Capability, req.Capability), false)
		}
		sc, err := parse(req.Payload[ScriptKey])
		if err != nil {
			log.Info("execute", append(fields, zap.String("behaviour", "invalid_script"))...)
			done(JournalPermanent)
			return adapter.Fail(adapter.ClassPermanent, "invalid_script", err.Error(), false)
		}
		if sc.onlyAttempts > 0 && int(req.Attempt) > sc.onlyAttempts {
			sc = script{}
		}
		fields = append(fields, zap.String("behaviour", sc.behaviour(req.Attempt)))
		if sc.sleep > 0 {
			fields = append(fields, zap.Duration("sleep", sc.sleep))
		}
		log.Info("execute", fields...)
		return run(ctx, log.With(plog.ExecutionID(req.ExecutionID), plog.Attempt(req.Attempt)), req, sc, done)
	}
}

// run does the scripted work and tells done how it ended (for the journal); for long work,
// when the background work ends, not when Execute answers Accepted.
func run(ctx context.Context, log *zap.Logger, req *adapter.Request, sc script, done func(outcome string)) adapter.Result {
	if err := sleep(ctx, sc.sleep); err != nil {
		done(JournalCancelled)
		return cancelled(err)
	}
	switch {
	case sc.hang:
		<-ctx.Done()
		done(JournalCancelled)
		return cancelled(ctx.Err())
	case sc.failPermanent:
		done(JournalPermanent)
		return adapter.Fail(adapter.ClassPermanent, "scripted_permanent", "scripted permanent failure", false)
	case int(req.Attempt) <= sc.failTransient:
		done(JournalTransient)
		return adapter.Fail(adapter.ClassTransient, "scripted_transient",
			fmt.Sprintf("scripted transient failure %d of %d", req.Attempt, sc.failTransient), true).RetryAfter(sc.retryAfter)
	case sc.hasCompleteLate:
		return adapter.Later(sc.lease, func(ctx context.Context, cb *adapter.Callbacks) adapter.Result {
			steps := 1
			if sc.hasProgressSteps {
				steps = sc.progressSteps
			}
			// Report i of steps is due at i/(steps+1) of the work; the work ends at its whole.
			start := time.Now()
			for i := 1; i <= steps; i++ {
				if err := sleep(ctx, time.Until(start.Add(sc.completeLater*time.Duration(i)/time.Duration(steps+1)))); err != nil {
					done(JournalCancelled)
					return cancelled(err)
				}
				progress := map[string]any{"percent": 100 * i / (steps + 1)}
				if sc.hasProgressSteps {
					progress["step"] = i
				}
				if sc.progressNUL {
					progress["note"] = "half\x00way"
				}
				if err := cb.ReportProgress(ctx, progress); err != nil {
					// Progress is informative; the work goes on without it.
					log.Warn("progress report failed", zap.Error(err))
				}
			}
			if err := sleep(ctx, time.Until(start.Add(sc.completeLater))); err != nil {
				done(JournalCancelled)
				return cancelled(err)
			}
			done(JournalSucceeded)
			return echo(req, sc)
		})
	}
	done(JournalSucceeded)
	return echo(req, sc)
}

func echo(req *adapter.Request, sc script) adapter.Result {
	payload := maps.Clone(req.Payload)
	delete(payload, ScriptKey)
	if payload == nil {
		payload = map[string]any{}
	}
	result := map[string]any{"echo": payload, "attempt": req.Attempt}
	if sc.resultNUL {
		result["nul"] = "a\x00b"
	}
	if sc.resultDepth > 0 {
		deep := map[string]any{}
		for range sc.resultDepth - 1 {
			deep = map[string]any{"a": deep}
		}
		result = deep
	}
	return adapter.Complete(result)
}

// cancelled answers an attempt whose context ended: the caller gave up or the adapter is
// shutting down, so another attempt may well succeed.
func cancelled(err error) adapter.Result {
	if err == context.DeadlineExceeded {
		return adapter.Fail(adapter.ClassTimeout, "deadline_exceeded", "the attempt's deadline passed", true)
	}
	return adapter.Fail(adapter.ClassUnavailable, "cancelled", "the attempt was cancelled", true)
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// parse reads the "dummy" object. Unknown keys are errors, so that a misspelt script fails
// loudly instead of silently echoing.
func parse(v any) (script, error) {
	sc := script{lease: DefaultLease}
	if v == nil {
		return sc, nil
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return sc, fmt.Errorf("%s must be an object", ScriptKey)
	}
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		val := obj[key]
		var err error
		switch key {
		case "fail_transient":
			sc.failTransient, err = count(key, val)
		case "retry_after_ms":
			sc.retryAfter, err = millis(key, val)
		case "fail_permanent":
			sc.failPermanent, err = boolean(key, val)
		case "sleep_ms":
			sc.sleep, err = millis(key, val)
		case "complete_later_ms":
			sc.completeLater, err = millis(key, val)
			sc.hasCompleteLate = true
		case "lease_ms":
			sc.lease, err = millis(key, val)
			if err == nil && sc.lease <= 0 {
				err = fmt.Errorf("%s.%s must be positive", ScriptKey, key)
			}
		case "hang":
			sc.hang, err = boolean(key, val)
		case "only_attempts":
			sc.onlyAttempts, err = count(key, val)
		case "result_nul":
			sc.resultNUL, err = boolean(key, val)
		case "result_depth":
			sc.resultDepth, err = count(key, val)
			if err == nil && sc.resultDepth > 100000 {
				err = fmt.Errorf("%s.%s must be at most 100000", ScriptKey, key)
			}
		case "progress_nul":
			sc.progressNUL, err = boolean(key, val)
		case "progress_steps":
			sc.progressSteps, err = count(key, val)
			sc.hasProgressSteps = true
			if err == nil && sc.progressSteps > 1000 {
				err = fmt.Errorf("%s.%s must be at most 1000", ScriptKey, key)
			}
		default:
			err = fmt.Errorf("%s.%s is not a known key", ScriptKey, key)
		}
		if err != nil {
			return sc, err
		}
	}
	return sc, nil
}

func count(key string, v any) (int, error) {
	f, ok := v.(float64)
	if !ok || f < 0 || f != math.Trunc(f) || f > math.MaxInt32 {
		return 0, fmt.Errorf("%s.%s must be a non-negative integer", ScriptKey, key)
	}
	return int(f), nil
}

func millis(key string, v any) (time.Duration, error) {
	n, err := count(key, v)
	return time.Duration(n) * time.Millisecond, err
}

func boolean(key string, v any) (bool, error) {
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("%s.%s must be true or false", ScriptKey, key)
	}
	return b, nil
}
