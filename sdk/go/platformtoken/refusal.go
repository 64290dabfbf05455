package platformtoken

import (
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The refusal marker: the google.rpc.ErrorInfo with which an adapter that refuses the platform's
// token says so, on the UNAUTHENTICATED it answers before doing anything (and before the
// integrations-received header). Its metadata's RefusalCheckKey names the check that failed. The
// platform spends no attempt on a call so refused (unless the check is CheckReplayed): only this
// marker tells it that nothing ran, so it is exact — the adapter protocol gives its bytes. The
// domain is the adapter protocol's, not that of the platform's own API errors: an adapter in
// another language answers it too.
const (
	RefusalDomain   = "integrations.platform"
	RefusalCheckKey = "check"
)

// RefusalReason is the marker's reason: errorsv1.ErrorReason_PLATFORM_TOKEN_REFUSED's name
// (TestRefusalReasonIsTheEnums holds it to the enum).
const RefusalReason = "PLATFORM_TOKEN_REFUSED"

// RefusalStatus is an adapter's answer to a call whose token Verify refused with err: code
// UNAUTHENTICATED, err's text as the message (it never quotes the token), and the marker naming
// the check (Check; an error that names none is reported as CheckInvalid — whatever went wrong,
// the token was not accepted). It is the marker built right by construction: an adapter on
// the SDK (sdk/go/adapter) answers it, and an adapter served otherwise can return RefusalStatus(err).Err().
func RefusalStatus(err error) *status.Status {
	check := Check(err)
	if check == "" {
		check = CheckInvalid
	}
	msg := "platform token refused"
	if err != nil {
		msg = err.Error()
	}
	st, derr := status.New(codes.Unauthenticated, msg).WithDetails(&errdetails.ErrorInfo{
		Reason: RefusalReason, Domain: RefusalDomain, Metadata: map[string]string{RefusalCheckKey: check},
	})
	if derr != nil {
		// An ErrorInfo always marshals; this is unreachable.
		panic(fmt.Sprintf("platform token refusal: %v", derr))
	}
	return st
}

// RefusalError is the error an adapter returns for a call whose token Verify refused: its
// GRPCStatus is RefusalStatus. A gRPC server answers it as it is; a server whose interceptors map
// errors to statuses of their own must let a *RefusalError (found with errors.As) through, as the
// platform's own servers do.
type RefusalError struct {
	cause error
	st    *status.Status
}

// Refuse is the RefusalError of a token Verify refused with err.
func Refuse(err error) *RefusalError { return &RefusalError{cause: err, st: RefusalStatus(err)} }

func (r *RefusalError) Error() string { return r.st.Message() }

// Unwrap is the refusal's cause, Verify's error.
func (r *RefusalError) Unwrap() error { return r.cause }

// GRPCStatus is RefusalStatus of the cause.
func (r *RefusalError) GRPCStatus() *status.Status { return r.st }

// ReceivedHeader is the response header an adapter sends the moment an Execute call reaches it,
// before its handler starts any work (the adapter SDK does). A call that then fails on a broken
// connection without that header never reached the adapter's handler, and the platform spends no
// attempt on it.
const ReceivedHeader = "integrations-received"

// Problems of a refusal marker, as Refusal.Problem names them.
const (
	// MarkerWrongDomain: an ErrorInfo with the marker's reason (in any case) but another domain.
	MarkerWrongDomain = "wrong_domain"
	// MarkerWrongReason: an ErrorInfo of the marker's domain with another reason.
	MarkerWrongReason = "wrong_reason"
	// MarkerWrongCode: the marker on an answer whose code is not UNAUTHENTICATED.
	MarkerWrongCode = "wrong_code"
	// MarkerNotErrorInfo: the marker's reason in the status message only, no ErrorInfo.
	MarkerNotErrorInfo = "no_error_info"
	// MarkerAfterReceived: a marker answered after the integrations-received header, which says
	// the handler started: the two contradict each other.
	MarkerAfterReceived = "after_received"
	// MarkerCheckMissing and MarkerCheckUnknown: the marker is taken, but its check metadata is
	// absent or not one of the Check constants.
	MarkerCheckMissing = "check_missing"
	MarkerCheckUnknown = "check_unknown"
)

// Refusal is what ReadRefusal found in an adapter's answer.
type Refusal struct {
	// Marked: the answer is the adapter's refusal of the token, taken as such — nothing ran, and
	// the attempt is not spent unless Check is CheckReplayed.
	Marked bool
	// Check is the marker's check metadata as sent (Marked, or a marker not taken).
	Check string
	// Problem is what is wrong with a marker the answer carries (one of the Marker constants), ""
	// when it carries none or a well-formed one. A marker that is not taken (Marked false) is an
	// ordinary failure of the attempt, which is spent; a Marked one may still have a problem with
	// its check.
	Problem string
	// Detail says the Problem in words, for logs.
	Detail string
}

// AttemptSpent reports whether the call so answered spends its attempt, as far as the marker
// decides: a refusal taken as one does not, unless it says the token was replayed (someone else
// ran this very request with it first).
func (r Refusal) AttemptSpent() bool { return !r.Marked || r.Check == CheckReplayed }

// ReadRefusal reads the refusal marker of an adapter's error answer err (a gRPC status error,
// possibly wrapped); received says whether the integrations-received header came before it. The
// marker is taken when the code is UNAUTHENTICATED, an ErrorInfo has exactly RefusalDomain and
// RefusalReason, and no received header came first. Anything that looks meant as the marker but
// is not one is reported as a Problem, so that the platform can say what is wrong instead of
// silently spending an attempt; an answer with no trace of the marker has none.
func ReadRefusal(err error, received bool) Refusal {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return Refusal{}
	}
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok && (i.GetDomain() == RefusalDomain || strings.EqualFold(i.GetReason(), RefusalReason)) {
			info = i
			break
		}
	}
	if info == nil {
		if strings.Contains(strings.ToUpper(st.Message()), RefusalReason) {
			return Refusal{Problem: MarkerNotErrorInfo,
				Detail: fmt.Sprintf("%s is in the status message only: the marker is a google.rpc.ErrorInfo detail", RefusalReason)}
		}
		return Refusal{}
	}
	r := Refusal{Check: info.GetMetadata()[RefusalCheckKey]}
	switch {
	case info.GetDomain() != RefusalDomain:
		r.Problem, r.Detail = MarkerWrongDomain, fmt.Sprintf("the ErrorInfo's domain is %q, want %q", info.GetDomain(), RefusalDomain)
	case info.GetReason() != RefusalReason:
		r.Problem, r.Detail = MarkerWrongReason, fmt.Sprintf("the ErrorInfo's reason is %q, want %q", info.GetReason(), RefusalReason)
	case st.Code() != codes.Unauthenticated:
		r.Problem, r.Detail = MarkerWrongCode, fmt.Sprintf("the marker came with code %s, want Unauthenticated", st.Code())
	case received:
		r.Problem, r.Detail = MarkerAfterReceived, "the marker came after the integrations-received header: a refusal is answered before it"
	default:
		r.Marked = true
		switch {
		case r.Check == "":
			r.Problem, r.Detail = MarkerCheckMissing, fmt.Sprintf("the ErrorInfo has no %q metadata", RefusalCheckKey)
		case !knownCheck(r.Check):
			r.Problem, r.Detail = MarkerCheckUnknown, fmt.Sprintf("the check %q is none of missing, key, invalid, audience, binding, replayed", r.Check)
		}
	}
	return r
}

// knownCheck reports whether name is one of the Check constants.
func knownCheck(name string) bool {
	for _, c := range checks {
		if c.name == name {
			return true
		}
	}
	return false
}
