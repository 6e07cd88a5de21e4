package jobs

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// riverTagRE is River's rule for tags (river/insert_opts.go).
var riverTagRE = regexp.MustCompile(`\A[\w][\w\-]+[\w]\z`)

func TestTagsAreRiverTagsForAnyTenantID(t *testing.T) {
	t.Parallel()
	for _, tenant := range []string{"acme", "", "a", "tenant.with.dots", "ümlaut", "end-", "x y/z", strings.Repeat("t", 300)} {
		for _, tag := range Tags(tenant, 42) {
			require.Regexp(t, riverTagRE, tag, "tenant %q", tenant)
			require.LessOrEqual(t, len(tag), maxTagLen)
		}
	}
	require.Equal(t, []string{"tenant_acme", "batch_42"}, Tags("acme", 42))
}

// TestJobsCarryTenantAndBatchTags: every way a batch's job is inserted
// (import, burst, resume, sweeper redelivery) tags it with its tenant and
// batch, which is what the River UI filters by.
func TestJobsCarryTenantAndBatchTags(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	id := f.importBatch(t, "tenant.tags")
	var tags []string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT tags FROM river_job WHERE (args->>'batch_id')::bigint = $1`, id).Scan(&tags))
	require.Equal(t, Tags("tenant.tags", id), tags)
	require.Equal(t, []string{"tenant_tenant-tags", "batch_" + strconv.FormatInt(id, 10)}, tags)

	// The sweeper's redelivery of an orphaned batch carries them too.
	_, err := f.pool.Exec(ctx, `DELETE FROM river_job WHERE (args->>'batch_id')::bigint = $1`, id)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE ingestion_batches SET updated_at = now() - interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
	s := &Sweeper{Pool: f.pool, River: f.enqueuer.River, Metrics: f.metrics}
	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT tags FROM river_job WHERE (args->>'batch_id')::bigint = $1`, id).Scan(&tags))
	require.Equal(t, Tags("tenant.tags", id), tags)
}
