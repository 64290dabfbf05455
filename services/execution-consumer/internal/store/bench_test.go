package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/pkg/batch"
)

// BenchmarkAttemptStartConcurrent starts attempts from 64 concurrent callers (the executions
// route's prefetch of two subscriptions), batched as the consumer does and one statement each as
// before, and reports attempts per statement. For docs/capacity.md:
//
//	go test -run '^$' -bench AttemptStartConcurrent -benchtime 2000x ./internal/store/
func BenchmarkAttemptStartConcurrent(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts batch.Options
	}{
		{"batched", batch.Options{MaxSize: startBatchMax, Concurrency: startBatchConcurrency}},
		{"one per statement", batch.Options{MaxSize: 1, Concurrency: 64}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			bb := setup(b)
			bb.store.starts = batch.New(bb.store.startBatch, tc.opts)
			ids := make([]string, b.N)
			for i := range ids {
				ids[i] = bb.insert(b, "pending", 0)
			}
			var next atomic.Int64
			ctx := context.Background()
			b.SetParallelism(64)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := next.Add(1) - 1
					if _, err := bb.store.AttemptStart(ctx, ids[i], 1, tokenHash(fmt.Sprint(i)), identity, time.Time{}); err != nil {
						b.Error(err)
					}
				}
			})
			st := bb.store.StartStats()
			b.ReportMetric(float64(st.Items)/float64(max(st.Batches, 1)), "attempts/statement")
		})
	}
}
