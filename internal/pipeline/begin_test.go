package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// reserveFolder reserves a Fleet batch of tenant-a for folder.
func reserveFolder(t *testing.T, store *batch.Store, folder string) batch.Batch {
	t.Helper()
	res, err := store.Reserve(context.Background(), batch.Reservation{
		CompanyID: "company-1", TenantID: "tenant-a", TenantDatabase: "tenant_db",
		SourceType: batch.SourceTypeFleetS3, IngestionMode: batch.IngestionModeFileUpload,
		PipelineStage: batch.PipelineStageFleet, SourceScope: "fleet_s3:" + folder,
		Details: batch.NewDetails(folder),
	})
	require.NoError(t, err)
	require.Equal(t, batch.Reserved, res.Outcome)
	return res.Batch
}

// acquireInTx opens a transaction on pool (rolled back at the test's end
// unless committed) and acquires batch id's lease in it with start, as the
// worker does before pipeline.Begin.
func acquireInTx(t *testing.T, pool *pgxpool.Pool, id int64, start lease.Start) (pgx.Tx, lease.Acquisition) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	a, err := lease.NewStore(tx).AcquireStarting(ctx, id, "delivery-1", time.Minute, start)
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, a.Outcome)
	return tx, a
}

// starter is a Pipeline whose Start records the loading phase.
type starter struct{}

func (starter) Execute(context.Context, *pipeline.Run) error { return nil }

func (starter) Start(_ batch.Batch, d batch.Details) (batch.Details, bool) {
	d.Phase = batch.PhaseLoading
	return d, true
}

// TestBeginWritesFromTheAcquisitionsRow: Begin works on the row the
// acquisition's UPDATE returned (no read of its own) and writes the
// Starter's checkpoint fenced on the term, in the acquisition's
// transaction; given a row that is not the one the term acquired, it
// refuses and writes nothing.
func TestBeginWritesFromTheAcquisitionsRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := batch.NewStore(pool)
	registry := pipeline.Registry{batch.SourceTypeFleetS3: starter{}}
	reserve := func(folder string) batch.Batch { return reserveFolder(t, store, folder) }
	phase := func(id int64) batch.Phase {
		got, err := store.Get(ctx, id)
		require.NoError(t, err)
		d, err := batch.ParseDetails(got.Details)
		require.NoError(t, err)
		return d.Phase
	}

	t.Run("starts from the acquisition's row", func(t *testing.T) {
		b := reserve("s3://bucket/begin-ok")
		tx, a := acquireInTx(t, pool, b.ID, lease.Start{})
		started, ok, err := pipeline.Begin(ctx, tx, store, a, registry)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, batch.PhaseLoading, phase(b.ID))
		got, err := store.Get(ctx, b.ID)
		require.NoError(t, err)
		require.Equal(t, got, started, "the batch Begin returns is the committed row")
	})

	t.Run("refuses a row the term did not acquire", func(t *testing.T) {
		b := reserve("s3://bucket/begin-mismatch")
		tx, a := acquireInTx(t, pool, b.ID, lease.Start{})
		a.Batch = b // the row before the acquisition
		_, ok, err := pipeline.Begin(ctx, tx, store, a, registry)
		require.Error(t, err)
		require.False(t, ok)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, batch.PhaseReserved, phase(b.ID), "nothing written")
	})
}

// phaseStarter is a PhaseStarter (reserved to loading, as the Fleet
// pipeline) whose Admit refuses the folders in refuse.
type phaseStarter struct {
	starter
	refuse map[string]bool
}

func (phaseStarter) StartPhases() (from, to batch.Phase) {
	return batch.PhaseReserved, batch.PhaseLoading
}

func (p phaseStarter) Start(b batch.Batch, d batch.Details) (batch.Details, bool) {
	if d.RedshiftCommitted || d.Phase == batch.PhaseLoading {
		return d, false
	}
	return p.starter.Start(b, d)
}

func (p phaseStarter) Admit(_ batch.Batch, d batch.Details) error {
	if p.refuse[d.SourceFolder] {
		return errors.New("refused")
	}
	return nil
}

// TestBeginChecksTheStartTheAcquisitionRecorded: an acquisition given
// StartOf(registry) records a PhaseStarter's phase in its own UPDATE (the
// new term names it), and Begin then writes nothing of its own; a batch
// the pipeline would not start (Admit refuses it, its details do not
// parse) gets its details back exactly as they were, and the term no
// longer names the phase, before the transaction commits; a batch not at
// the start's phase, or parked, is not started by the acquisition.
func TestBeginChecksTheStartTheAcquisitionRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := batch.NewStore(pool)
	registry := pipeline.Registry{batch.SourceTypeFleetS3: phaseStarter{refuse: map[string]bool{"s3://bucket/refused": true}}}
	start := pipeline.StartOf(registry)
	require.Equal(t, lease.Start{SourceTypes: []batch.SourceType{batch.SourceTypeFleetS3}, From: batch.PhaseReserved, To: batch.PhaseLoading, Version: batch.DetailsVersion}, start)
	reserve := func(folder string) batch.Batch { return reserveFolder(t, store, folder) }
	// begin acquires b with the start and runs Begin in one committed
	// transaction, as the worker does.
	begin := func(b batch.Batch) (lease.Acquisition, batch.Batch, bool) {
		t.Helper()
		tx, a := acquireInTx(t, pool, b.ID, start)
		got, ok, err := pipeline.Begin(ctx, tx, store, a, registry)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		return a, got, ok
	}
	lastTerm := func(id int64) lease.Term {
		t.Helper()
		var raw []byte
		require.NoError(t, pool.QueryRow(ctx, `SELECT execution_lease_terms FROM ingestion_batches WHERE id = $1`, id).Scan(&raw))
		terms, err := lease.ParseTerms(raw)
		require.NoError(t, err)
		require.NotEmpty(t, terms)
		return terms[len(terms)-1]
	}

	t.Run("recorded by the acquisition", func(t *testing.T) {
		b := reserve("s3://bucket/started")
		a, got, ok := begin(b)
		require.True(t, a.Started)
		require.True(t, ok)
		d, err := batch.ParseDetails(got.Details)
		require.NoError(t, err)
		require.Equal(t, batch.PhaseLoading, d.Phase)
		before, err := batch.ParseDetails(b.Details)
		require.NoError(t, err)
		before.Phase = batch.PhaseLoading
		require.Equal(t, before, d, "only the phase changed: no write of Begin's own")
		stored, err := store.Get(ctx, b.ID)
		require.NoError(t, err)
		require.Equal(t, stored, got, "the batch Begin returns is the committed row")
		require.Equal(t, batch.PhaseLoading, lastTerm(b.ID).Phase, "the term names the phase it recorded")
	})

	for name, tc := range map[string]struct {
		folder, details string // details: set before the acquisition
		// notStarted: the acquisition does not record the start either
		// (details of another version).
		notStarted bool
	}{
		"refused by the pipeline's Admit": {folder: "s3://bucket/refused"},
		"details that do not parse":       {folder: "s3://bucket/unparsable", details: `{"version": 1, "phase": "reserved", "sourceFolder": "s3://bucket/unparsable", "redshiftCommitted": false, "PHASE": "published"}`},
		"details of a newer version": {folder: "s3://bucket/newer", notStarted: true,
			details: `{"version": 2, "phase": "reserved", "sourceFolder": "s3://bucket/newer", "redshiftCommitted": false}`},
	} {
		t.Run(name, func(t *testing.T) {
			b := reserve(tc.folder)
			if tc.details != "" {
				_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET details = $2 WHERE id = $1`, b.ID, tc.details)
				require.NoError(t, err)
				b, err = store.Get(ctx, b.ID)
				require.NoError(t, err)
			}
			a, got, ok := begin(b)
			require.Equal(t, !tc.notStarted, a.Started, "the acquisition cannot tell a refusal: it records the phase of its own version's documents")
			require.False(t, ok)
			require.Equal(t, string(b.Details), string(got.Details), "the details exactly as before the acquisition")
			stored, err := store.Get(ctx, b.ID)
			require.NoError(t, err)
			require.Equal(t, string(b.Details), string(stored.Details))
			require.Empty(t, lastTerm(b.ID).Phase, "the term no longer names the phase")
			require.Equal(t, a.Lease.Generation, stored.LeaseGeneration, "the lease is still held")
		})
	}

	t.Run("details holding a newer build's keys", func(t *testing.T) {
		b := reserve("s3://bucket/newer-keys")
		_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET details = details || '{"lineage": {"hops": 2}, "publication": {"started": false, "completed": false, "channel": "fast"}}' WHERE id = $1`, b.ID)
		require.NoError(t, err)
		a, got, ok := begin(b)
		require.True(t, a.Started)
		require.True(t, ok, "keys this build does not know are no reason to refuse the batch")
		var d struct {
			Phase       string          `json:"phase"`
			Lineage     json.RawMessage `json:"lineage"`
			Publication struct {
				Channel string `json:"channel"`
			} `json:"publication"`
		}
		require.NoError(t, json.Unmarshal(got.Details, &d))
		require.Equal(t, "loading", d.Phase)
		require.JSONEq(t, `{"hops": 2}`, string(d.Lineage))
		require.Equal(t, "fast", d.Publication.Channel)
	})

	t.Run("not at the start's phase, or parked", func(t *testing.T) {
		loading := reserve("s3://bucket/loading-already")
		_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET details = jsonb_set(details, '{phase}', '"loading"') WHERE id = $1`, loading.ID)
		require.NoError(t, err)
		a, _, ok := begin(loading)
		require.False(t, a.Started)
		require.False(t, ok, "the pipeline's Start has nothing to record either")
		require.Empty(t, lastTerm(loading.ID).Phase)

		parked := reserve("s3://bucket/parked")
		_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET parked_at = now(), parked_reason = 'test' WHERE id = $1`, parked.ID)
		require.NoError(t, err)
		a, got, ok := begin(parked)
		require.False(t, a.Started)
		require.False(t, ok)
		d, err := batch.ParseDetails(got.Details)
		require.NoError(t, err)
		require.Equal(t, batch.PhaseReserved, d.Phase)
	})
}
