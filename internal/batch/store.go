package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the store needs of a connection: a *pgxpool.Pool, a *pgx.Conn
// or a pgx.Tx. Begin on a transaction opens a savepoint, so store operations
// stay atomic inside a caller's transaction too.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store reads and writes ingestion_batches.
type Store struct {
	db     DB
	outbox Outbox
}

// NewStore returns a store working on db.
func NewStore(db DB) *Store { return &Store{db: db} }

// Begin starts a transaction on the store's database, for operations of a
// WithTx store that must commit together.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) { return s.db.Begin(ctx) }

// WithTx returns a store whose operations run inside tx, so they commit or
// roll back with the caller's other work (for example a River job insert).
// It keeps the store's Outbox. An error from one of its writes means tx is
// to be rolled back: an outcome and its announcement share tx with no
// savepoint of their own (see announced).
func (s *Store) WithTx(tx pgx.Tx) *Store { return &Store{db: tx, outbox: s.outbox} }

// columns is the select list scanned by scanBatch.
const columns = `id, company_id, tenant_id, tenant_database, ingestion_mode, source_type,
	business_date, pipeline_stage, status, is_current, details, started_at, completed_at,
	created_at, updated_at, source_scope, execution_lease_id, execution_lease_expires_at,
	execution_lease_generation, execution_lease_renewed_at, parked_at, parked_reason,
	cancelled_at, cancelled_by, cancel_reason, COALESCE(batch_uid::text, '') AS batch_uid`

// Columns is the select list of a whole batch row, for a statement of
// another package that returns one (RETURNING Columns) and reads it with
// Scan: the lease acquisition returns the row it updated, so the
// delivery need not read it again.
const Columns = columns

// Scan reads a row selected with Columns followed by extra columns into a
// Batch and extra; ErrNotFound when there is no row.
func Scan(row pgx.Row, extra ...any) (Batch, error) { return scanBatch(row, extra...) }

func scanBatch(row pgx.Row, extra ...any) (Batch, error) {
	var b Batch
	dest := append([]any{
		&b.ID, &b.CompanyID, &b.TenantID, &b.TenantDatabase, &b.IngestionMode, &b.SourceType,
		&b.BusinessDate, &b.PipelineStage, &b.Status, &b.IsCurrent, &b.Details, &b.StartedAt, &b.CompletedAt,
		&b.CreatedAt, &b.UpdatedAt, &b.SourceScope, &b.LeaseID, &b.LeaseExpiresAt,
		&b.LeaseGeneration, &b.LeaseRenewedAt, &b.ParkedAt, &b.ParkedReason,
		&b.CancelledAt, &b.CancelledBy, &b.CancelReason, &b.UID,
	}, extra...)
	if err := row.Scan(dest...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return Batch{}, ErrNotFound
		}
		return Batch{}, err
	}
	return b, nil
}

// NewBatch is the input of Create: a date-scoped batch as created before
// Fleet imports existed.
type NewBatch struct {
	CompanyID      string
	TenantID       string
	TenantDatabase string
	IngestionMode  IngestionMode
	SourceType     SourceType
	BusinessDate   *time.Time
	PipelineStage  string
	// Details is a JSON document; empty means {}.
	Details json.RawMessage
}

func (n *NewBatch) validate() error {
	for _, err := range []error{
		ValidateCompanyID(n.CompanyID),
		ValidateTenantID(n.TenantID),
		ValidateTenantDatabase(n.TenantDatabase),
		checkText("pipeline_stage", n.PipelineStage, MaxPipelineStageLen),
	} {
		if err != nil {
			return err
		}
	}
	if !validSourceType(n.SourceType) {
		return &ValidationError{"source_type", fmt.Sprintf("unknown source type %q", n.SourceType)}
	}
	if !validIngestionMode(n.IngestionMode) {
		return &ValidationError{"ingestion_mode", fmt.Sprintf("unknown ingestion mode %q", n.IngestionMode)}
	}
	if len(n.Details) > 0 && !json.Valid(n.Details) {
		return &ValidationError{"details", "must be a JSON document"}
	}
	return nil
}

// Create inserts a Running batch without a source scope: the generic,
// date-scoped creation used by Brink POS and KDS CDC ingestion.
func (s *Store) Create(ctx context.Context, n NewBatch) (Batch, error) {
	if err := n.validate(); err != nil {
		return Batch{}, err
	}
	details := n.Details
	if len(details) == 0 {
		details = json.RawMessage(`{}`)
	}
	return scanBatch(s.db.QueryRow(ctx, `
		INSERT INTO ingestion_batches
			(company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			 business_date, pipeline_stage, status, details)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'Running', $8)
		RETURNING `+columns,
		n.CompanyID, n.TenantID, n.TenantDatabase, n.IngestionMode, n.SourceType,
		n.BusinessDate, n.PipelineStage, string(details)))
}

// Get returns the batch with the given id, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (Batch, error) {
	return scanBatch(s.db.QueryRow(ctx, `SELECT `+columns+` FROM ingestion_batches WHERE id = $1`, id))
}

// Expect states what a caller expects of a batch it locks. Empty fields are
// not checked.
type Expect struct {
	TenantID    string
	SourceType  SourceType
	SourceScope string
	Status      Status
}

// GetForUpdate locks the batch row until the end of the transaction s runs in
// (use WithTx) and checks it against want. It returns ErrNotFound when no
// batch has the id, or an error wrapping ErrUnexpectedBatch that names the
// first field that differs.
func (s *Store) GetForUpdate(ctx context.Context, id int64, want Expect) (Batch, error) {
	b, err := scanBatch(s.db.QueryRow(ctx, `SELECT `+columns+` FROM ingestion_batches WHERE id = $1 FOR UPDATE`, id))
	if err != nil {
		return Batch{}, err
	}
	if err := want.check(&b); err != nil {
		return b, err
	}
	return b, nil
}

func (want Expect) check(b *Batch) error {
	mismatch := func(field, got, expected string) error {
		return fmt.Errorf("%w: %s is %q, expected %q", ErrUnexpectedBatch, field, got, expected)
	}
	switch {
	case want.TenantID != "" && b.TenantID != want.TenantID:
		return fmt.Errorf("%w: tenant_id differs", ErrUnexpectedBatch)
	case want.SourceType != "" && b.SourceType != want.SourceType:
		return mismatch("source_type", string(b.SourceType), string(want.SourceType))
	case want.SourceScope != "" && b.Scope() != want.SourceScope:
		return mismatch("source_scope", b.Scope(), want.SourceScope)
	case want.Status != "" && b.Status != want.Status:
		return mismatch("status", string(b.Status), string(want.Status))
	}
	return nil
}

// lockBatch reads the batch id with the database clock and locks its row
// until the end of tx. Row-level security hides from a locking read the
// rows a login may not update (the operator login's Succeeded batches, see
// deploy/postgres/roles.sql), so a row the lock did not find is read again
// without it: the caller refuses a batch it may not change (it is
// terminal) rather than answering that it does not exist.
func lockBatch(ctx context.Context, tx pgx.Tx, id int64) (b Batch, now time.Time, err error) {
	b, err = scanBatch(tx.QueryRow(ctx, `SELECT `+columns+`, now() FROM ingestion_batches WHERE id = $1 FOR UPDATE`, id), &now)
	if errors.Is(err, ErrNotFound) {
		b, err = scanBatch(tx.QueryRow(ctx, `SELECT `+columns+`, now() FROM ingestion_batches WHERE id = $1`, id), &now)
	}
	return b, now, err
}

// UpdateStatus sets a date-scoped batch's status, without a lease: the
// generic operation of date-scoped ingestion. Terminal statuses stamp
// completed_at. It returns ErrScopedBatch, writing nothing, for a batch with
// a source scope: those change only through reservations, fenced writes,
// Resume and Cancel, which keep their rules.
func (s *Store) UpdateStatus(ctx context.Context, id int64, status Status) error {
	return s.execUnscoped(ctx, id, `
		UPDATE ingestion_batches
		SET status = $2::text,
		    completed_at = CASE WHEN $2::text = 'Running' THEN NULL ELSE now() END,
		    updated_at = now()
		WHERE id = $1 AND source_scope IS NULL`, id, status)
}

// UpdateDetails replaces a date-scoped batch's details document, without a
// lease. It returns ErrScopedBatch, writing nothing, for a scoped batch.
func (s *Store) UpdateDetails(ctx context.Context, id int64, details json.RawMessage) error {
	if !json.Valid(details) {
		return &ValidationError{"details", "must be a JSON document"}
	}
	return s.execUnscoped(ctx, id, `UPDATE ingestion_batches SET details = $2, updated_at = now() WHERE id = $1 AND source_scope IS NULL`, id, string(details))
}

// UpdateStatusAndDetails sets status and details of a date-scoped batch in
// one statement, so the two are never seen apart. It returns ErrScopedBatch,
// writing nothing, for a scoped batch.
func (s *Store) UpdateStatusAndDetails(ctx context.Context, id int64, status Status, details json.RawMessage) error {
	if !json.Valid(details) {
		return &ValidationError{"details", "must be a JSON document"}
	}
	return s.execUnscoped(ctx, id, `
		UPDATE ingestion_batches
		SET status = $2::text, details = $3,
		    completed_at = CASE WHEN $2::text = 'Running' THEN NULL ELSE now() END,
		    updated_at = now()
		WHERE id = $1 AND source_scope IS NULL`, id, status, string(details))
}

// execUnscoped runs a generic update that only touches unscoped batches and
// explains a miss: ErrScopedBatch if batch id has a scope, else ErrNotFound.
func (s *Store) execUnscoped(ctx context.Context, id int64, sql string, args ...any) error {
	tag, err := s.db.Exec(ctx, sql, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var scoped bool
	err = s.db.QueryRow(ctx, `SELECT source_scope IS NOT NULL FROM ingestion_batches WHERE id = $1`, id).Scan(&scoped)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrNotFound
	case err != nil:
		return err
	case scoped:
		return ErrScopedBatch
	}
	return ErrNotFound
}

// SetCurrent marks a date-scoped batch as the current one for its tenant,
// business date and pipeline stage, clearing the flag on the previous current
// batch in the same transaction. It returns ErrNotDateScoped for a batch
// without a business date (Fleet batches never become current).
func (s *Store) SetCurrent(ctx context.Context, id int64) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		b, err := scanBatch(tx.QueryRow(ctx, `SELECT `+columns+` FROM ingestion_batches WHERE id = $1 FOR UPDATE`, id))
		if err != nil {
			return err
		}
		if b.BusinessDate == nil {
			return ErrNotDateScoped
		}
		if _, err := tx.Exec(ctx, `
			UPDATE ingestion_batches SET is_current = false, updated_at = now()
			WHERE tenant_id = $1 AND business_date = $2 AND pipeline_stage = $3 AND is_current AND id <> $4`,
			b.TenantID, b.BusinessDate, b.PipelineStage, id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE ingestion_batches SET is_current = true, updated_at = now() WHERE id = $1`, id)
		return err
	})
}

// GetCurrent returns the current batch for a tenant, business date and
// pipeline stage, or ErrNotFound.
func (s *Store) GetCurrent(ctx context.Context, tenantID string, businessDate time.Time, stage string) (Batch, error) {
	return scanBatch(s.db.QueryRow(ctx, `
		SELECT `+columns+` FROM ingestion_batches
		WHERE tenant_id = $1 AND business_date = $2 AND pipeline_stage = $3 AND is_current`,
		tenantID, businessDate, stage))
}

// ListFilter selects batches for List. Zero fields do not filter.
type ListFilter struct {
	Status   Status
	TenantID string
	// Stuck keeps Running batches that no delivery is working on: those
	// whose execution lease has expired, and parked ones.
	Stuck bool
	// Parked keeps parked batches only.
	Parked bool
	// ScopedOnly keeps batches with a source scope.
	ScopedOnly bool
	// Limit defaults to 50.
	Limit int
}

// List returns batches matching f, newest first, and the database clock.
func (s *Store) List(ctx context.Context, f ListFilter) ([]Batch, time.Time, error) {
	if f.Limit <= 0 {
		f.Limit = 50
	}
	var now time.Time
	if err := s.db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, now, err
	}
	rows, err := s.db.Query(ctx, `
		SELECT `+columns+` FROM ingestion_batches
		WHERE ($1::text = '' OR status = $1::text)
		  AND ($2::text = '' OR tenant_id = $2::text)
		  AND (NOT $3::bool OR (status = 'Running' AND (execution_lease_expires_at < now() OR parked_at IS NOT NULL)))
		  AND (NOT $4::bool OR source_scope IS NOT NULL)
		  AND (NOT $6::bool OR (status = 'Running' AND parked_at IS NOT NULL))
		ORDER BY id DESC
		LIMIT $5`, string(f.Status), f.TenantID, f.Stuck, f.ScopedOnly, f.Limit, f.Parked)
	if err != nil {
		return nil, now, err
	}
	defer rows.Close()
	var out []Batch
	for rows.Next() {
		b, err := scanBatch(rows)
		if err != nil {
			return nil, now, err
		}
		out = append(out, b)
	}
	return out, now, rows.Err()
}

// Now returns the database clock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := s.db.QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, err
}

// Latest returns the newest batch of a tenant and source scope, or
// ErrNotFound.
func (s *Store) Latest(ctx context.Context, tenantID, scope string) (Batch, error) {
	return scanBatch(s.db.QueryRow(ctx, `
		SELECT `+columns+` FROM ingestion_batches
		WHERE tenant_id = $1 AND source_scope = $2
		ORDER BY id DESC LIMIT 1`, tenantID, scope))
}
