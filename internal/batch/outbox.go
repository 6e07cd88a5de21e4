package batch

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Outbox is told of every outcome a Store writes, in the transaction of
// that write: a batch reaching Succeeded or Failed (MarkSucceeded,
// MarkFailed, Cancel) or parked (Park). What it records there (a River
// job: jobs.Outbox) commits with the outcome or rolls back with it, so an
// outcome is never announced unless it was written, and never written
// without its announcement.
//
// Two writes are not announced: RecordFailedEnqueue(Many), whose batch
// never ran and whose importer is answered enqueue_failed on the spot
// (the announcement would ride the River insert that just failed), and
// UpdateStatus of unscoped, date-scoped batches.
type Outbox interface {
	// Outcome records the outcome of b, as the write left it, in tx. An
	// error rolls the write back.
	Outcome(ctx context.Context, tx pgx.Tx, b Batch) error
}

// WithOutbox returns a store that tells o of every outcome it writes (see
// Outbox). A nil o announces nothing.
func (s *Store) WithOutbox(o Outbox) *Store { return &Store{db: s.db, outbox: o} }

// announced runs write, a statement that may end a batch, and tells the
// store's outbox of the outcome it wrote, in one transaction. Without an
// outbox, or when mayEnd says the write cannot be an outcome (a fenced
// write keeping the batch Running), it is just write on the store's
// connection, with no transaction of its own. write returns whether the
// batch it wrote is an outcome.
//
// On a store inside a caller's transaction (WithTx, or NewStore of a
// pgx.Tx) the write and its announcement run in that transaction as they
// are, with no savepoint of their own: an error from either is returned,
// and the caller rolls its transaction back, as every caller does on an
// error from a store write (committing after it would keep the outcome
// without its announcement). A savepoint pair there was two statements
// for every batch's terminal write, in the publication's transaction.
func (s *Store) announced(ctx context.Context, mayEnd bool, write func(db DB) (Batch, bool, error)) (Batch, error) {
	if s.outbox == nil || !mayEnd {
		b, _, err := write(s.db)
		return b, err
	}
	if tx, ok := s.db.(pgx.Tx); ok {
		b, outcome, err := write(tx)
		if err != nil || !outcome {
			return b, err
		}
		return b, s.outbox.Outcome(ctx, tx, b)
	}
	var b Batch
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var (
			outcome bool
			err     error
		)
		if b, outcome, err = write(tx); err != nil || !outcome {
			return err
		}
		return s.outbox.Outcome(ctx, tx, b)
	})
	return b, err
}
