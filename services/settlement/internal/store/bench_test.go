package store

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/batch"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// BenchmarkSettleConcurrent settles b.N running executions from 64 concurrent callers (as the
// execution-consumer's and adapter-callback's handlers do under load), half Settle and half a
// retryable FailAttempt, batched against one statement (and one commit) per settlement.
// go test -run '^$' -bench SettleConcurrent ./internal/store/
func BenchmarkSettleConcurrent(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts batch.Options
	}{
		{"batched", batch.Options{Name: "settlement", MaxSize: settleBatchMax, Concurrency: settleBatchConcurrency}},
		{"batched, two at a time", batch.Options{Name: "settlement", MaxSize: settleBatchMax, Concurrency: 2}},
		{"one statement each", batch.Options{Name: "settlement", MaxSize: 1, Concurrency: 64}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := dbtest.NewSchema(b)
			s.ApplyCatalog(b, dbtest.TestCatalog)
			st := New(s.Pool)
			st.batcher = batch.New(st.settleBatch, tc.opts)
			ids := make([]string, b.N)
			for i := range ids {
				ids[i] = s.InsertExecution(b, dbtest.Execution{Status: execution.StatusRunning, Attempt: 1, Deadline: dayFromNow()})
				s.InsertAttempts(b, ids[i], dbtest.Attempt{N: 1})
			}
			const callers = 64
			work := make(chan int)
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			b.ResetTimer()
			for range callers {
				wg.Go(func() {
					for i := range work {
						var err error
						if i%2 == 0 {
							_, err = st.ExecutionSettle(context.Background(), *succeed(ids[i], 1).settle)
						} else {
							_, err = st.AttemptFail(context.Background(), *failRetryable(ids[i], 1).fail)
						}
						if err != nil {
							select {
							case errs <- err:
							default:
							}
						}
					}
				})
			}
			for i := range ids {
				work <- i
			}
			close(work)
			wg.Wait()
			b.StopTimer()
			close(errs)
			for err := range errs {
				require.NoError(b, err)
			}
			stats := st.SettleStats()
			b.ReportMetric(float64(stats.Items)/float64(stats.Batches), "settlements/batch")
			b.ReportMetric(float64(stats.Largest), "largest")
		})
	}
}
