// Package adaptercheck checks that an adapter keeps the adapter protocol
// (docs/adapter-protocol.md): it plays the platform against the adapter's AdapterService — signing
// tokens as the platform does, and forging, expiring and replaying them — and serves
// AdapterCallbackService itself, answering callbacks as the platform's adapter-callback service
// does. Each property is a named Rule with a verdict and a line saying why.
//
// It speaks only the wire protocol: nothing in it depends on the adapter being written with the Go
// SDK (sdk/go/adapter), so it checks an adapter in any language. `integrationsctl adapter check` is
// its command line.
package adaptercheck

import (
	"cmp"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// Rule names one property of the protocol the check verifies.
type Rule string

// The rules, in the order the report lists them.
const (
	RuleUnsigned Rule = "unsigned-refused"
	RuleForged   Rule = "forged-refused"
	RuleExpired  Rule = "expired-refused"
	RuleReplayed Rule = "replayed-refused"
	RuleAudience Rule = "audience-refused"
	RuleBinding  Rule = "binding-refused"
	RuleDeadline Rule = "answers-within-deadline"
	RuleReceived Rule = "received-header"
	RuleCancel   Rule = "cancel-honoured"
	RuleLease    Rule = "lease-renewed"
	RuleComplete Rule = "completion-accepted-once"
	RuleLate     Rule = "second-completion-refused-late"
)

// Rules lists every rule with what it checks, in report order.
var Rules = []struct {
	Rule Rule
	What string
}{
	{RuleUnsigned, "an Execute without a platform token is refused with the marker, check \"missing\", before integrations-received"},
	{RuleForged, "a token signed by a key the adapter does not hold is refused with the marker, check \"key\""},
	{RuleExpired, "an expired token is refused with the marker, check \"invalid\""},
	{RuleReplayed, "a token presented a second time is refused with the marker, check \"replayed\" (the first is answered)"},
	{RuleAudience, "a token addressed to another adapter is refused with the marker, check \"audience\""},
	{RuleBinding, "a token signed for another request is refused with the marker, check \"binding\""},
	{RuleDeadline, "a valid sync Execute is answered completed or failed within the call's deadline"},
	{RuleReceived, "the answer carries the integrations-received header (a warning only: the spec says should)"},
	{RuleCancel, "Cancel of accepted work answers stopped=true, and the work sends no success and stops renewing"},
	{RuleLease, "accepted work renews its lease before it runs out, until it completes"},
	{RuleComplete, "the work's Complete is accepted once, and no second Complete follows"},
	{RuleLate, "a Complete whose answer was lost is retried, and the retry's ABORTED NO_LONGER_APPLICABLE is taken as final"},
}

// Verdict is a rule's outcome.
type Verdict string

// Verdicts. Only Fail fails the check; Warn says something the spec recommends is missing, Skip
// that the rule could not be tried (another rule's failure says why).
const (
	Pass Verdict = "PASS"
	Fail Verdict = "FAIL"
	Warn Verdict = "WARN"
	Skip Verdict = "SKIP"
)

// Result is one rule's verdict and the line that explains it.
type Result struct {
	Rule    Rule
	Verdict Verdict
	Detail  string
}

func pass(r Rule, format string, args ...any) Result {
	return Result{Rule: r, Verdict: Pass, Detail: fmt.Sprintf(format, args...)}
}

func fail(r Rule, format string, args ...any) Result {
	return Result{Rule: r, Verdict: Fail, Detail: fmt.Sprintf(format, args...)}
}

func skip(r Rule, format string, args ...any) Result {
	return Result{Rule: r, Verdict: Skip, Detail: fmt.Sprintf(format, args...)}
}

// Report is the verdict of every rule, in report order.
type Report struct {
	Results []Result
}

// Failed names the rules that failed.
func (r *Report) Failed() []Rule {
	var failed []Rule
	for _, res := range r.Results {
		if res.Verdict == Fail {
			failed = append(failed, res.Rule)
		}
	}
	return failed
}

// Result is the verdict of rule (the zero Result if it was not checked).
func (r *Report) Result(rule Rule) Result {
	for _, res := range r.Results {
		if res.Rule == rule {
			return res
		}
	}
	return Result{}
}

// Write prints one line per rule and a summary line.
func (r *Report) Write(w io.Writer) error {
	var b strings.Builder
	counts := map[Verdict]int{}
	for _, res := range r.Results {
		counts[res.Verdict]++
		fmt.Fprintf(&b, "%s  %-32s %s\n", res.Verdict, res.Rule, res.Detail)
	}
	fmt.Fprintf(&b, "%d rules: %d passed, %d failed, %d warned, %d skipped",
		len(r.Results), counts[Pass], counts[Fail], counts[Warn], counts[Skip])
	if failed := r.Failed(); len(failed) > 0 {
		names := make([]string, len(failed))
		for i, f := range failed {
			names[i] = string(f)
		}
		fmt.Fprintf(&b, " (%s)", strings.Join(names, ", "))
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// Defaults of Config's durations.
const (
	DefaultSyncTimeout = 30 * time.Second
	DefaultLease       = 2 * time.Second
	DefaultLeaseGrace  = time.Second
	DefaultDeadline    = time.Minute
	DefaultWait        = 30 * time.Second
)

// Config says which adapter to check and how to play the platform.
type Config struct {
	// Addr is the adapter's AdapterService, host:port.
	Addr string
	// DialOptions are added when dialling Addr, e.g. TLS transport credentials; without any the
	// connection is plaintext, as the platform dials adapters today.
	DialOptions []grpc.DialOption
	// AdapterID is the adapter's catalog id: the audience of the tokens.
	AdapterID string
	// Key signs the tokens: the adapter must hold its public key (INTEGRATIONS_PLATFORM_PUBLIC_KEYS).
	Key ed25519.PrivateKey

	// Capability and Payload make the adapter answer a sync Execute within the call (completed or
	// failed); the token rules send them too. A nil Payload is {}.
	Capability string
	Payload    *structpb.Struct
	// LongCapability (default Capability) and LongPayload make the adapter answer an async
	// Execute Accepted, with work that outlasts Lease and ends in Complete. Nil LongPayload skips
	// the rules of long work (cancel, lease, completions).
	LongCapability string
	LongPayload    *structpb.Struct

	// Callbacks is where the check serves AdapterCallbackService: the adapter must be configured
	// to call back there (the address it is given, as it is given the platform's). Required with
	// LongPayload. The check closes it.
	Callbacks net.Listener
	// Credential, when set, is the bearer credential callbacks must carry (the adapter's, from the
	// catalog); when empty any non-empty bearer credential is taken.
	Credential string

	// SyncTimeout is a sync call's deadline (the capability's sync timeout).
	SyncTimeout time.Duration
	// Lease is the capability's lease: the most the check grants, for Accepted and each renewal.
	Lease time.Duration
	// LeaseGrace is how late a renewal may come after the lease ended and still count, for
	// scheduling on a busy machine (the platform's sweeper allows 5 s).
	LeaseGrace time.Duration
	// Deadline is an async execution's deadline.
	Deadline time.Duration
	// Wait bounds how long the check awaits something the adapter must do soon (a retried
	// Complete); at least 10 s, the least time the spec has an adapter retry an outcome.
	Wait time.Duration
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.SyncTimeout, DefaultSyncTimeout)
	def(&c.Lease, DefaultLease)
	def(&c.LeaseGrace, DefaultLeaseGrace)
	def(&c.Deadline, DefaultDeadline)
	def(&c.Wait, DefaultWait)
	c.LongCapability = cmp.Or(c.LongCapability, c.Capability)
	c.Payload = cmp.Or(c.Payload, &structpb.Struct{})
	return c
}

// Validate names the first setting that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("the adapter's address is required"))
	}
	if c.AdapterID == "" {
		errs = append(errs, errors.New("the adapter id (the tokens' audience) is required"))
	}
	if len(c.Key) != ed25519.PrivateKeySize {
		errs = append(errs, errors.New("a platform signing key is required"))
	}
	if c.Capability == "" {
		errs = append(errs, errors.New("the capability is required"))
	}
	if c.LongPayload != nil && c.Callbacks == nil {
		errs = append(errs, errors.New("the long-work rules need a listener for the callback service"))
	}
	if c.Wait > 0 && c.Wait < 10*time.Second {
		errs = append(errs, fmt.Errorf("wait %s: at least 10s (an adapter retries an outcome for at least 10 s)", c.Wait))
	}
	return errors.Join(errs...)
}
