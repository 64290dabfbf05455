package execution_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/integrations-platform/integrations/pkg/execution"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	policy := execution.RetryPolicy{MaxAttempts: 4, Schedule: []time.Duration{time.Minute, 5 * time.Minute}}
	half := func(d time.Duration) time.Duration { return d / 2 }
	tests := []struct {
		name       string
		n          int32
		policy     execution.RetryPolicy
		retryable  bool
		retryAfter time.Duration
		exhausted  string
		scale      func(time.Duration) time.Duration
		want       execution.Decision
	}{
		{"a permanent failure ends it", 1, policy, false, 0, "", nil,
			execution.Decision{Exhausted: execution.ReasonAdapterPermanent}},
		{"permanent wins over a given reason", 1, policy, false, 0, execution.ReasonLeaseExpired, nil,
			execution.Decision{Exhausted: execution.ReasonAdapterPermanent}},
		{"the ceiling reached", 4, policy, true, 0, "", nil,
			execution.Decision{Exhausted: execution.ReasonAttemptLimit}},
		{"past the ceiling", 5, policy, true, 0, "", nil,
			execution.Decision{Exhausted: execution.ReasonAttemptLimit}},
		{"the ceiling reached, the sweeper's reason", 4, policy, true, 0, execution.ReasonLeaseExpired, nil,
			execution.Decision{Exhausted: execution.ReasonLeaseExpired}},
		{"attempt 1 waits the first delay", 1, policy, true, 0, "", nil,
			execution.Decision{Delay: time.Minute, Budget: execution.ReasonBudget}},
		{"attempt 2 the second", 2, policy, true, 0, "", nil,
			execution.Decision{Delay: 5 * time.Minute, Budget: execution.ReasonBudget}},
		{"past the schedule the last repeats", 3, policy, true, 0, "", nil,
			execution.Decision{Delay: 5 * time.Minute, Budget: execution.ReasonBudget}},
		{"a later retry_after wins", 1, policy, true, 2 * time.Minute, "", nil,
			execution.Decision{Delay: 2 * time.Minute, Budget: execution.ReasonBudget}},
		{"an earlier retry_after does not", 2, policy, true, 2 * time.Minute, "", nil,
			execution.Decision{Delay: 5 * time.Minute, Budget: execution.ReasonBudget}},
		{"scaled", 1, policy, true, 0, "", half,
			execution.Decision{Delay: 30 * time.Second, Budget: execution.ReasonBudget}},
		{"retry_after scaled too", 1, policy, true, 4 * time.Minute, "", half,
			execution.Decision{Delay: 2 * time.Minute, Budget: execution.ReasonBudget}},
		{"the sweeper's reason for the budget", 1, policy, true, 0, execution.ReasonLeaseExpired, nil,
			execution.Decision{Delay: time.Minute, Budget: execution.ReasonLeaseExpired}},
		{"no schedule: at once", 1, execution.RetryPolicy{MaxAttempts: 3}, true, 0, "", nil,
			execution.Decision{Budget: execution.ReasonBudget}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := execution.Decide(tt.n, tt.policy, tt.retryable, tt.retryAfter, tt.exhausted, tt.scale)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestScheduleFromMillis(t *testing.T) {
	t.Parallel()
	assert.Equal(t, []time.Duration{1500 * time.Millisecond, time.Hour}, execution.ScheduleFromMillis([]int64{1500, 3_600_000}))
}
