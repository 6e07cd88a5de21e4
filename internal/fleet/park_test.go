package fleet_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/pipeline"
)

// TestBatchesThisBuildCannotWorkOnAreParked: each kind of batch a delivery
// cannot work on is parked with its reason, its details untouched; once it
// can be worked on (here: its details repaired, as a newer build would read
// them), the next delivery unparks it and finishes it.
func TestBatchesThisBuildCannotWorkOnAreParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	registry := pipeline.Registry{batch.SourceTypeFleetS3: e.pipeline}
	setDetails := func(id int64, raw string) {
		t.Helper()
		_, err := e.pool.Exec(ctx, `UPDATE ingestion_batches SET details = $2 WHERE id = $1`, id, raw)
		require.NoError(t, err)
	}
	deliver := func(id int64, reg pipeline.Registry) pipeline.Result {
		t.Helper()
		a, err := e.leases.Acquire(ctx, id, "delivery", time.Minute)
		require.NoError(t, err)
		require.Equal(t, lease.Acquired, a.Outcome)
		res, err := pipeline.Execute(ctx, e.store, a.Lease, nil, reg)
		require.NoError(t, err)
		_, err = e.leases.Release(ctx, a.Lease)
		require.NoError(t, err)
		return res
	}
	for name, tt := range map[string]struct {
		details  string
		registry pipeline.Registry
		reason   string
	}{
		"older unknown version": {`{"version": 0, "phase": "warp"}`, registry, "details version 0 unknown to this build"},
		"unparsable":            {`{"version": 1, "phase": "loading", "Phase": "published", "redshiftCommitted": false, "publication": {"started": false, "completed": false}}`, registry, "batch details are not a valid details document"},
		"no-work phase":         {`{"version": 1, "phase": "failed_pre_commit", "redshiftCommitted": false, "publication": {"started": false, "completed": false}}`, registry, "Running in phase failed_pre_commit, in which no work is done"},
		"no such pipeline":      {"", pipeline.Registry{}, `no pipeline for source type "FleetS3" in this build`},
	} {
		b := e.reserve("tenant-"+name, e.folder(sampleFiles))
		if tt.details != "" {
			setDetails(b.ID, tt.details)
		}
		res := deliver(b.ID, tt.registry)
		require.Equal(t, pipeline.Parked, res.Outcome, name)
		require.ErrorContains(t, res.Err, tt.reason, name)
		got, err := e.store.Get(ctx, b.ID)
		require.NoError(t, err)
		require.True(t, got.Parked(), name)
		require.Contains(t, *got.ParkedReason, tt.reason, name)
		require.Equal(t, batch.StatusRunning, got.Status, name)
		if tt.details != "" {
			require.JSONEq(t, tt.details, detailsWithoutLeases(t, got.Details), "%s: parking never rewrites the details", name)
		}
	}

	// A batch that can be worked on again is unparked and finished.
	b := e.reserve("tenant-repaired", e.folder(sampleFiles))
	good := b.Details
	setDetails(b.ID, `{"version": 0}`)
	require.Equal(t, pipeline.Parked, deliver(b.ID, registry).Outcome)
	setDetails(b.ID, string(good))
	res := deliver(b.ID, registry)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	got, err := e.store.Get(ctx, b.ID)
	require.NoError(t, err)
	require.False(t, got.Parked())
	require.Nil(t, got.ParkedAt)
}

// TestANewerVersionIsLeftToANewerBuild: details of a version newer than
// this build's were written by a newer build, with a change this build
// cannot honour. Before, the delivery parked such a batch, and no newer
// worker took it back without an operator; now Execute writes nothing
// (no park, no status, no details) and says LeftToNewer, for the caller
// to release the lease and snooze. Once the version is one this build
// knows, the next delivery works it.
func TestANewerVersionIsLeftToANewerBuild(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	registry := pipeline.Registry{batch.SourceTypeFleetS3: e.pipeline}
	b := e.reserve("tenant-newer", e.folder(sampleFiles))
	newer := `{"version": 2, "phase": "staged", "sourceFolder": "` + *b.SourceScope + `", "stages": [{"name": "load"}]}`
	_, err := e.pool.Exec(ctx, `UPDATE ingestion_batches SET details = $2 WHERE id = $1`, b.ID, newer)
	require.NoError(t, err)
	before, err := e.store.Get(ctx, b.ID)
	require.NoError(t, err)

	a, err := e.leases.Acquire(ctx, b.ID, "older-build", time.Minute)
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, a.Outcome)
	res, err := pipeline.Execute(ctx, e.store, a.Lease, nil, registry)
	require.NoError(t, err)
	require.Equal(t, pipeline.LeftToNewer, res.Outcome)
	require.ErrorContains(t, res.Err, "details version 2 is newer than this build's (1)")
	got, err := e.store.Get(ctx, b.ID)
	require.NoError(t, err)
	require.False(t, got.Parked(), "never parked")
	require.Nil(t, got.ParkedReason)
	require.Equal(t, batch.StatusRunning, got.Status)
	require.Equal(t, before.Details, got.Details, "nothing written")
	_, err = e.leases.Release(ctx, a.Lease)
	require.NoError(t, err)

	_, err = e.pool.Exec(ctx, `UPDATE ingestion_batches SET details = $2 WHERE id = $1`, b.ID, b.Details)
	require.NoError(t, err)
	a, err = e.leases.Acquire(ctx, b.ID, "newer-build", time.Minute)
	require.NoError(t, err)
	res, err = pipeline.Execute(ctx, e.store, a.Lease, nil, registry)
	require.NoError(t, err)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
}

// detailsWithoutLeases drops the lease audit trail the lease statements
// maintain, which is not the pipeline's to keep or change.
func detailsWithoutLeases(t *testing.T, raw []byte) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	delete(m, "leases")
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return string(out)
}

// TestBatchWithAnInvisibleTenantIsParked: the worker re-validates a batch
// row's identifiers with the doors' allow-list before reading a byte, so a
// row written before the allow-list (or by another writer) whose tenant
// holds U+034F (combining grapheme joiner) or U+3164 (Hangul filler) is
// parked unread, with the field and the character in its reason — for a
// local folder too, whose path names no tenant to compare with.
func TestBatchWithAnInvisibleTenantIsParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	registry := pipeline.Registry{batch.SourceTypeFleetS3: e.pipeline}
	for column, tc := range map[string]struct{ value, char string }{"tenant_id": {"ac\u034fme", "U+034F"}, "company_id": {"\u3164", "U+3164"}} {
		b := e.reserve("tenant-"+column, e.folder(sampleFiles))
		_, err := e.pool.Exec(ctx, `UPDATE ingestion_batches SET `+column+` = $2 WHERE id = $1`, b.ID, tc.value)
		require.NoError(t, err)
		a, err := e.leases.Acquire(ctx, b.ID, "delivery", time.Minute)
		require.NoError(t, err)
		res, err := pipeline.Execute(ctx, e.store, a.Lease, nil, registry)
		require.NoError(t, err)
		require.Equal(t, pipeline.Parked, res.Outcome, column)
		got, err := e.store.Get(ctx, b.ID)
		require.NoError(t, err)
		require.True(t, got.Parked(), column)
		require.Contains(t, *got.ParkedReason, column, column)
		require.Contains(t, *got.ParkedReason, tc.char, column)
		d, err := batch.ParseDetails(got.Details)
		require.NoError(t, err)
		require.Equal(t, batch.PhaseReserved, d.Phase, "%s: nothing was read", column)
	}
}
