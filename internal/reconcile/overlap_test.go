package reconcile_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/reconcile"
)

// pausedImporter runs before once, at the first burst, then imports.
type pausedImporter struct {
	reconcile.Importer
	once   sync.Once
	before func()
}

func (p *pausedImporter) ImportMany(ctx context.Context, reqs []jobs.ImportRequest) ([]jobs.Result, error) {
	p.once.Do(p.before)
	return p.Importer.ImportMany(ctx, reqs)
}

// TestOverlappingScansReimportAChangeOnce: a published folder gains a file.
// A first scan compares it with its load and finds the change; before it
// imports, a second scan (a one-shot run during a period, say) finds the
// same change and imports it, and that import is loaded and published.
// The first scan's import then finds a newer batch than the one it
// compared: it answers superseded (naming that batch) and reserves
// nothing. Before, it reserved a third batch: the change loaded twice.
func TestOverlappingScansReimportAChangeOnce(t *testing.T) {
	t.Parallel()
	f := newLoadFixture(t)
	f.put(folderA+"/part-1.csv", "vehicle,km\nV1,10\n")
	f.put(folderA+"/_SUCCESS", "")
	sum, _ := f.scan(f.cfg)
	require.Equal(t, map[string]int{"enqueued": 1}, sum.Outcomes)
	first := f.loadRunning()
	require.Len(t, first, 1)

	f.put(folderA+"/part-2.csv", "vehicle,km\nV2,20\n")
	var second reconcile.Folder
	var reimport []int64
	slow := f.cfg
	slow.Importer = &pausedImporter{Importer: f.cfg.Importer, before: func() {
		sum, reports := f.scan(f.cfg)
		require.Equal(t, map[string]int{"reimported": 1}, sum.Outcomes)
		second = reports[folderA]
		reimport = f.loadRunning()
	}}
	sum, reports := f.scan(slow)

	require.Equal(t, reconcile.OutcomeReimported, second.Outcome)
	require.Equal(t, first[0], second.Change.PreviousBatchID)
	require.Equal(t, []int64{second.BatchID}, reimport)
	require.Equal(t, map[string]int{"superseded": 1}, sum.Outcomes, "the change was imported twice")
	got := reports[folderA]
	require.Equal(t, reconcile.OutcomeSuperseded, got.Outcome)
	require.Equal(t, second.BatchID, got.BatchID, "superseded names the newer batch")
	require.NotNil(t, got.Change, "the change it found is still reported")
	batches, _ := f.batches(t)
	require.Equal(t, 2, batches, "one load, one re-import")
}
