package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// BenchmarkAcquire measures taking the free lease of a freshly reserved
// batch (one UPDATE that also appends the term to the lease trail,
// execution_lease_terms), as a new delivery does. Compare with
// BenchmarkBaselineRawUpdate in the same run.
func BenchmarkAcquire(b *testing.B) {
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	leases := lease.NewStore(pool)
	ids := make([]int64, b.N)
	for i := range ids {
		ids[i] = reserve(b, pool, "tenant-bench", fmt.Sprintf("s3://bucket/acq-%d", i)).ID
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a, err := leases.Acquire(ctx, ids[i], fmt.Sprintf("d-%d", i), time.Minute)
		if err != nil || a.Outcome != lease.Acquired {
			b.Fatalf("acquire: %v %v", a.Outcome, err)
		}
	}
}

// BenchmarkAcquireRepeated takes and releases the leases of a few batches
// over and over, so their lease trails stay at their bound: the worst case.
func BenchmarkAcquireRepeated(b *testing.B) {
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	leases := lease.NewStore(pool)
	ids := make([]int64, 64)
	for i := range ids {
		ids[i] = reserve(b, pool, "tenant-bench", fmt.Sprintf("s3://bucket/acq-%d", i)).ID
	}
	var held []lease.Lease
	for i := 0; b.Loop(); i++ {
		if i%len(ids) == 0 && len(held) > 0 {
			b.StopTimer()
			for _, l := range held {
				if _, err := leases.Release(ctx, l); err != nil {
					b.Fatal(err)
				}
			}
			held = held[:0]
			b.StartTimer()
		}
		a, err := leases.Acquire(ctx, ids[i%len(ids)], fmt.Sprintf("d-%d", i), time.Minute)
		if err != nil || a.Outcome != lease.Acquired {
			b.Fatalf("acquire: %v %v", a.Outcome, err)
		}
		held = append(held, a.Lease)
	}
}

// BenchmarkAcquireContended measures the contended path: the lease is held
// live by another delivery.
func BenchmarkAcquireContended(b *testing.B) {
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	leases := lease.NewStore(pool)
	id := reserve(b, pool, "tenant-bench", "s3://bucket/contended").ID
	if _, err := leases.Acquire(ctx, id, "holder", time.Hour); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		a, err := leases.Acquire(ctx, id, "other", time.Hour)
		if err != nil || a.Outcome != lease.Held {
			b.Fatalf("acquire: %v %v", a.Outcome, err)
		}
	}
}

// BenchmarkRenew measures one heartbeat renewal.
func BenchmarkRenew(b *testing.B) {
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	leases := lease.NewStore(pool)
	id := reserve(b, pool, "tenant-bench", "s3://bucket/renew").ID
	a, err := leases.Acquire(ctx, id, "holder", time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	l := a.Lease
	for b.Loop() {
		var ok bool
		l, ok, err = leases.Renew(ctx, l, time.Minute)
		if err != nil || !ok {
			b.Fatalf("renew: %v %v", ok, err)
		}
	}
}

// BenchmarkBaselineRawUpdate is the physical baseline for acquire and renew:
// a raw single-row UPDATE by primary key on the same table.
func BenchmarkBaselineRawUpdate(b *testing.B) {
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	id := reserve(b, pool, "tenant-bench", "s3://bucket/raw").ID
	for b.Loop() {
		if _, err := pool.Exec(ctx, `UPDATE ingestion_batches SET updated_at = now() WHERE id = $1`, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenewMany64 renews 64 held terms with one statement, as a worker
// process does once per period: the cost of one renewal round.
func BenchmarkRenewMany64(b *testing.B) {
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	leases := lease.NewStore(pool)
	held := make([]lease.Lease, 64)
	for i := range held {
		id := reserve(b, pool, "tenant-bench", fmt.Sprintf("s3://bucket/many-%d", i)).ID
		a, err := leases.Acquire(ctx, id, fmt.Sprintf("d-%d", i), time.Hour)
		if err != nil || a.Outcome != lease.Acquired {
			b.Fatalf("acquire: %v %v", a.Outcome, err)
		}
		held[i] = a.Lease
	}
	for b.Loop() {
		res, err := leases.RenewMany(ctx, held, time.Hour)
		if err != nil || !res[0].Held {
			b.Fatalf("renew: %v", err)
		}
	}
}
