package execution

import "time"

// RetryPolicy is what the retry decision needs of an execution: its attempt ceiling
// (executions.max_attempts) and its capability's schedule (capabilities.retry_delays_ms), the
// delay before attempt n+1 being Schedule[n-1], the last one repeating.
type RetryPolicy struct {
	MaxAttempts int32
	Schedule    []time.Duration
}

// Decision is what follows a failed attempt. Exhausted names why no attempt follows (a failure
// reason); when it is empty a next attempt is due Delay after the failure — if the deadline
// allows it, which the database judges with its own clock (now() + Delay past deadline_at), the
// reason then being Budget.
type Decision struct {
	Exhausted string
	Delay     time.Duration
	Budget    string
}

// Decide is the retry decision for failed attempt n of an execution under policy p. A permanent
// failure (not retryable) ends it as adapter.permanent; the ceiling reached ends it as
// exhausted, retry_exhausted.attempt_limit unless given (the sweeper's lease_expired); otherwise
// the next attempt's delay is the schedule's for n, or the adapter's retryAfter if later, scaled
// (tests and demos shrink the schedule), and a next attempt past the deadline would end it as
// exhausted, retry_exhausted.budget unless given.
func Decide(n int32, p RetryPolicy, retryable bool, retryAfter time.Duration, exhausted string,
	scale func(time.Duration) time.Duration) Decision {
	switch {
	case !retryable:
		return Decision{Exhausted: ReasonAdapterPermanent}
	case n >= p.MaxAttempts:
		return Decision{Exhausted: orReason(exhausted, ReasonAttemptLimit)}
	}
	var delay time.Duration
	if len(p.Schedule) > 0 {
		delay = p.Schedule[min(max(int(n), 1), len(p.Schedule))-1]
	}
	if scale == nil {
		scale = func(d time.Duration) time.Duration { return d }
	}
	return Decision{Delay: scale(max(delay, retryAfter)), Budget: orReason(exhausted, ReasonBudget)}
}

func orReason(given, standard string) string {
	if given != "" {
		return given
	}
	return standard
}

// ScheduleFromMillis reads capabilities.retry_delays_ms.
func ScheduleFromMillis(ms []int64) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, v := range ms {
		out[i] = time.Duration(v) * time.Millisecond
	}
	return out
}
