package warehouse

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/ingest/internal/batch"
)

// WithBatchFence returns the local warehouse on the same pool with the batch
// fence on: use it when the warehouse shares the operational database (the
// default locally), so the table ingestion_batches is in reach of its
// transactions.
//
// The caller's beforeCommit lease check runs on another connection, so an
// operator's cancel (or a takeover) can commit between that check and the
// warehouse commit. With the fence, the last statement of every load and
// publication transaction locks the batch row and checks, in the same
// transaction as the warehouse write, that the batch is still Running under
// the slice's lease generation and that the lease has not expired; a
// publication also records its completion in the row's details
// (publication.completed), so a cancel that waited for the row lock sees a
// published batch and refuses it. Whichever commits first wins: a cancel
// before the commit aborts it with batch.ErrStaleLease; a cancel after a
// publication finds it published. The heartbeat's renewals wait for the
// row lock only for the moment between the fence and the commit.
//
// A warehouse in a database of its own (Redshift, or --warehouse-url) cannot
// take this lock: see docs/reliability.md, Known limits.
func (p *Postgres) WithBatchFence() *Postgres {
	c := *p
	c.fence = true
	return &c
}

var _ CommitRecorder = (*Postgres)(nil)

// RecordsCommits implements CommitRecorder: with the batch fence on, a load
// runs the caller's Record as its transaction's last statement.
func (p *Postgres) RecordsCommits() bool { return p.fence }

// loadFenceSQL locks the batch row and checks the term the slice was
// loaded under. clock_timestamp, not now(): now() is the start of a
// transaction that may have been loading for a long time.
const loadFenceSQL = `
	SELECT status = 'Running' AND execution_lease_generation = $2
	       AND execution_lease_expires_at > clock_timestamp()
	FROM ingestion_batches WHERE id = $1
	FOR SHARE`

// publishFenceSQL locks the batch row, checks the term and records the
// publication in the same transaction as the warehouse's.
const publishFenceSQL = `
	UPDATE ingestion_batches
	SET details = jsonb_set(details, '{publication}',
	        COALESCE(details->'publication', '{}'::jsonb) || jsonb_build_object('completed', true, 'completedAt', $3::timestamptz)),
	    updated_at = now()
	WHERE id = $1 AND status = 'Running' AND execution_lease_generation = $2
	  AND execution_lease_expires_at > clock_timestamp()
	RETURNING id`

// fenceLoad is the last statement of a load's transaction when the fence
// is on: see WithBatchFence. The caller's Record (WithRecord), when ctx
// carries one, takes the fence's place: it is a fenced write of the batch
// row (status Running, the lease's id and generation, unexpired by
// clock_timestamp), so it locks and checks the row as the fence does and
// records the commit in the same transaction.
func (p *Postgres) fenceLoad(ctx context.Context, tx pgx.Tx, s Slice, st Stamp) error {
	if !p.fence {
		return nil
	}
	if rec := RecordFrom(ctx); rec != nil {
		return rec(ctx, tx, st)
	}
	var held bool
	err := tx.QueryRow(ctx, loadFenceSQL, s.BatchID, s.Generation).Scan(&held)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Row-level security hides from the worker's locking read a batch
		// that is no longer Running (deploy/postgres/roles.sql).
		return fmt.Errorf("%w: batch %d not found, or no longer Running, at the warehouse commit", batch.ErrStaleLease, s.BatchID)
	case err != nil:
		return fmt.Errorf("fencing the load on batch %d: %w", s.BatchID, err)
	case !held:
		return fmt.Errorf("%w: batch %d is no longer Running under generation %d at the warehouse commit", batch.ErrStaleLease, s.BatchID, s.Generation)
	}
	return nil
}

// fencePublish is the last statement of a publication's transaction when
// the fence is on: see WithBatchFence. The caller's Record (WithRecord),
// when ctx carries one, takes the fence's place, as in fenceLoad: the
// pipeline records the batch Succeeded there, so a cancel that waited for
// the row lock finds it Succeeded.
func (p *Postgres) fencePublish(ctx context.Context, tx pgx.Tx, s Slice, st Stamp) error {
	if !p.fence {
		return nil
	}
	if rec := RecordFrom(ctx); rec != nil {
		return rec(ctx, tx, st)
	}
	var id int64
	err := tx.QueryRow(ctx, publishFenceSQL, s.BatchID, s.Generation, st.PublishedAt).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: batch %d is no longer Running under generation %d at the publication's commit", batch.ErrStaleLease, s.BatchID, s.Generation)
	case err != nil:
		return fmt.Errorf("fencing the publication on batch %d: %w", s.BatchID, err)
	}
	return nil
}
