package warehouse

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/folder"
)

// Postgres is the local warehouse: schema curated in a PostgreSQL database
// (by default the operational one). It streams records with COPY FROM STDIN.
type Postgres struct {
	pool  *pgxpool.Pool
	fence bool // see WithBatchFence
}

// NewPostgres returns the local warehouse on pool.
func NewPostgres(pool *pgxpool.Pool) *Postgres { return &Postgres{pool: pool} }

// Pool is the pool the warehouse loads on (its connection metrics).
func (p *Postgres) Pool() *pgxpool.Pool { return p.pool }

var recordColumns = []string{"tenant_id", "source_scope", "batch_id", "object_key", "line_number", "record"}

// loadTag names a load's session in pg_stat_activity (application_name):
// fleet-load:{slice key}:{batch}:{generation}, at most 63 bytes.
func loadTag(s Slice) (prefix, tag string) {
	h := fnv.New64a()
	h.Write([]byte(s.TenantID))
	h.Write([]byte{0})
	h.Write([]byte(s.SourceScope))
	prefix = fmt.Sprintf("fleet-load:%016x:", h.Sum64())
	return prefix, prefix + strconv.FormatInt(s.BatchID, 36) + ":" + strconv.FormatInt(s.Generation, 36)
}

// Load implements Warehouse.
//
// A load whose lease checks out and that finds the slice locked terminates
// any other load of the same slice still in the database before it waits:
// one Running batch holds a scope at a time, so such a load belongs to a
// delivery that lost its lease (a paused or partitioned worker) and would
// otherwise hold the slice's locks until it woke up. Its transaction is
// rolled back.
func (p *Postgres) Load(ctx context.Context, s Slice, src *folder.Source, objects []folder.Object, beforeCommit func(context.Context) error) (Stamp, error) {
	var st Stamp
	prefix, tag := loadTag(s)
	// The session's name is set with BEGIN, in its round trip (the tag
	// holds only [a-z0-9:-], so it is a safe literal).
	opts := pgx.TxOptions{BeginQuery: "BEGIN; SELECT set_config('application_name', '" + tag + "', true)"}
	// The caller's lease check before the load starts, unless the load
	// ends with the caller's Record (the fence on, see checkBeforeFence):
	// that fenced write of the batch row is the check at the commit, so
	// the load checks first only if it finds the slice locked, before it
	// terminates another session (below). A lost lease meanwhile cancels
	// ctx (the holder's heartbeat), and the load stops there.
	recorded := p.recorded(ctx)
	err := pgx.BeginTxFunc(ctx, p.pool, opts, func(tx pgx.Tx) error {
		if beforeCommit != nil && !recorded {
			if err := beforeCommit(ctx); err != nil {
				return err
			}
		}
		// Serialise loads and publications of one slice; the slice row may
		// not exist yet, so lock the key rather than the row. The try and
		// the read of the slice's stamp go in one round trip; the stamp is
		// read again once a held lock was waited for.
		//
		// Only a load that finds the lock held looks for a stale load to
		// terminate (its lease checked out above): a stale load holds nothing
		// of the slice before it has the lock (and, once it has it, the
		// stamp check below refuses it after ours), and reading
		// pg_stat_activity on every load costs every backend's entry,
		// which at hundreds of connections was a tenth of the server's CPU
		// per batch.
		var free bool
		cur, found := Stamp{}, false
		b := &pgx.Batch{}
		b.Queue(`SELECT pg_try_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))`, s.TenantID, s.SourceScope).
			QueryRow(func(row pgx.Row) error { return row.Scan(&free) })
		b.Queue(stampSQL, s.TenantID, s.SourceScope).QueryRow(func(row pgx.Row) error {
			var err error
			cur, found, err = scanStamp(row)
			return err
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if !free {
			if beforeCommit != nil && recorded {
				if err := beforeCommit(ctx); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `
				SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE application_name LIKE $1 || '%' AND application_name <> $2 AND pid <> pg_backend_pid()`, prefix, tag); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))`, s.TenantID, s.SourceScope); err != nil {
				return err
			}
			var err error
			if cur, found, err = scanStamp(tx.QueryRow(ctx, stampSQL, s.TenantID, s.SourceScope)); err != nil {
				return err
			}
		}
		if found && Supersedes(cur, s) {
			return &SupersededError{Holder: cur.Ref(), Generation: cur.Generation}
		}
		// The slice's records are deleted before any record is read: a
		// load blocked on the table shows no progress, so a draining
		// worker gives it up when its grace ends.
		if _, err := tx.Exec(ctx, deleteSliceSQL, s.TenantID, s.SourceScope); err != nil {
			return err
		}
		rr := src.Records(ctx, objects)
		defer rr.Close()
		ledger := NewLedgerCounter(s, src, objects)
		// A small folder (the usual upload) is read whole, then inserted
		// and stamped in one pipelined round trip. A larger one is
		// streamed with COPY, starting with the records already read.
		head, whole := readHead(rr)
		if err := rr.Err(); err != nil {
			return err
		}
		for _, k := range head.keys {
			ledger.Count(k)
		}
		if whole {
			b = &pgx.Batch{}
			if len(head.keys) > 0 {
				b.Queue(insertRecordsSQL, s.TenantID, s.SourceScope, s.BatchID, head.keys, head.lines, head.records).Fn =
					func(br pgx.BatchResults) error {
						_, err := br.Exec()
						return interpretCopyError(err)
					}
			}
			b.Queue(stampSliceSQL, s.TenantID, s.SourceScope, s.BatchID, s.Generation, int64(len(head.keys)), s.BatchUID).
				QueryRow(func(row pgx.Row) error {
					return row.Scan(&st.BatchID, &st.BatchUID, &st.Generation, &st.RecordCount, &st.CommittedAt)
				})
			queueLedger(b, s, ledger.Objects())
			queueErrors(b, s, rr.Bad())
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
		} else {
			n, err := tx.CopyFrom(ctx, pgx.Identifier{"curated", "fleet_records"}, recordColumns, &copySource{s: s, rr: rr, head: head, ledger: ledger})
			if err != nil {
				if rerr := rr.Err(); rerr != nil {
					return rerr
				}
				return interpretCopyError(err)
			}
			b = &pgx.Batch{}
			b.Queue(stampSliceSQL, s.TenantID, s.SourceScope, s.BatchID, s.Generation, n, s.BatchUID).
				QueryRow(func(row pgx.Row) error {
					return row.Scan(&st.BatchID, &st.BatchUID, &st.Generation, &st.RecordCount, &st.CommittedAt)
				})
			queueLedger(b, s, ledger.Objects())
			queueErrors(b, s, rr.Bad())
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
		}
		st.BadRecords = int64(len(rr.Bad()))
		if err := p.checkBeforeFence(ctx, beforeCommit); err != nil {
			return err
		}
		return p.fenceLoad(ctx, tx, s, st)
	})
	if err != nil {
		return Stamp{}, err
	}
	return st, nil
}

// checkBeforeFence runs the caller's lease check before a commit, unless
// the caller's Record takes the fence's place: Record is then the check,
// in the transaction itself (see Record), and a round trip fewer.
func (p *Postgres) checkBeforeFence(ctx context.Context, beforeCommit func(context.Context) error) error {
	if beforeCommit == nil || p.recorded(ctx) {
		return nil
	}
	return beforeCommit(ctx)
}

// recorded reports whether a transaction given ctx ends with the caller's
// Record (the fence on and a Record in ctx): a fenced write of the batch
// row, the lease check at the commit.
func (p *Postgres) recorded(ctx context.Context) bool { return p.fence && RecordFrom(ctx) != nil }

// stampSQL reads the batch (id and uid) and generation a slice was last
// loaded by.
const stampSQL = `
	SELECT batch_id, COALESCE(batch_uid, ''), lease_generation FROM curated.fleet_slices
	WHERE tenant_id = $1 AND source_scope = $2`

// scanStamp reads stampSQL's row; found is false when the slice has none.
func scanStamp(row pgx.Row) (st Stamp, found bool, err error) {
	err = row.Scan(&st.BatchID, &st.BatchUID, &st.Generation)
	if errors.Is(err, pgx.ErrNoRows) {
		return Stamp{}, false, nil
	}
	return st, err == nil, err
}

// interpretCopyError marks data errors raised by the server while storing
// records (SQLSTATE class 22, such as a character jsonb cannot hold) as
// malformed records.
func interpretCopyError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 && pgErr.Code[:2] == "22" {
		return fmt.Errorf("%w: %s", folder.ErrMalformed, pgErr.Message)
	}
	return err
}

// Statements of a load's replacement of its slice.
const (
	deleteSliceSQL = `DELETE FROM curated.fleet_records WHERE tenant_id = $1 AND source_scope = $2`
	// insertRecordsSQL is the COPY of a small folder's records: the
	// record text is cast to jsonb as COPY's input is.
	insertRecordsSQL = `
		INSERT INTO curated.fleet_records (tenant_id, source_scope, batch_id, object_key, line_number, record)
		SELECT $1::varchar, $2::varchar, $3::bigint, r.object_key, r.line_number, r.record::jsonb
		FROM unnest($4::text[], $5::bigint[], $6::text[]) WITH ORDINALITY AS r(object_key, line_number, record, i)
		ORDER BY r.i`
	stampSliceSQL = `
		INSERT INTO curated.fleet_slices
			(tenant_id, source_scope, batch_id, lease_generation, record_count, committed_at, published_at, batch_uid)
		VALUES ($1, $2, $3, $4, $5, now(), NULL, NULLIF($6::varchar, ''))
		ON CONFLICT (tenant_id, source_scope) DO UPDATE
		SET batch_id = EXCLUDED.batch_id, batch_uid = EXCLUDED.batch_uid, lease_generation = EXCLUDED.lease_generation,
		    record_count = EXCLUDED.record_count, committed_at = EXCLUDED.committed_at,
		    published_at = NULL
		RETURNING batch_id, COALESCE(batch_uid, ''), lease_generation, record_count, committed_at`
)

// Statements of the load ledger: the slice's rows are replaced in the
// load's transaction, after its records and stamp.
const (
	deleteLedgerSQL = `DELETE FROM curated.fleet_load_objects WHERE tenant_id = $1 AND source_scope = $2`
	insertLedgerSQL = `
		INSERT INTO curated.fleet_load_objects
			(tenant_id, source_scope, batch_id, batch_uid, object_key, etag, size_bytes, record_count, last_modified, marker_modified)
		SELECT $1::varchar, $2::varchar, $3::bigint, NULLIF($10::varchar, ''), o.object_key, o.etag, o.size_bytes, o.record_count, o.last_modified, $4::timestamptz
		FROM unnest($5::text[], $6::text[], $7::bigint[], $8::bigint[], $9::timestamptz[])
			AS o(object_key, etag, size_bytes, record_count, last_modified)`
)

// queueLedger queues the replacement of the slice's ledger rows with
// objects: one DELETE and one INSERT, whatever the number of objects.
func queueLedger(b *pgx.Batch, s Slice, objects []LedgerObject) {
	b.Queue(deleteLedgerSQL, s.TenantID, s.SourceScope)
	if len(objects) == 0 {
		return
	}
	var (
		keys   = make([]string, len(objects))
		etags  = make([]string, len(objects))
		sizes  = make([]int64, len(objects))
		counts = make([]int64, len(objects))
		mods   = make([]time.Time, len(objects))
		marker *time.Time
	)
	for i, o := range objects {
		keys[i], etags[i], sizes[i], counts[i], mods[i] = o.ObjectKey, o.ETag, o.SizeBytes, o.RecordCount, o.LastModified
		marker = o.MarkerModified
	}
	b.Queue(insertLedgerSQL, s.TenantID, s.SourceScope, s.BatchID, marker, keys, etags, sizes, counts, mods, s.BatchUID)
}

// Statements of a load's replacement of its load errors, queued in the
// load's transaction, after its ledger.
const (
	deleteErrorsSQL = `DELETE FROM curated.fleet_load_errors WHERE tenant_id = $1 AND source_scope = $2`
	insertErrorsSQL = `
		INSERT INTO curated.fleet_load_errors
			(tenant_id, source_scope, batch_id, batch_uid, ordinal, object_key, line_number, column_number, reason, raw_excerpt)
		SELECT $1::varchar, $2::varchar, $3::bigint, NULLIF($9::varchar, ''), e.i, e.object_key, e.line_number, e.column_number, e.reason, e.raw_excerpt
		FROM unnest($4::text[], $5::bigint[], $6::int[], $7::text[], $8::text[]) WITH ORDINALITY
			AS e(object_key, line_number, column_number, reason, raw_excerpt, i)`
)

// queueErrors queues the replacement of the slice's load errors with the
// bad records its reader skipped: one DELETE and, when there are any, one
// INSERT.
func queueErrors(b *pgx.Batch, s Slice, bad []folder.BadRecord) {
	b.Queue(deleteErrorsSQL, s.TenantID, s.SourceScope)
	if len(bad) == 0 {
		return
	}
	var (
		keys    = make([]string, len(bad))
		lines   = make([]int64, len(bad))
		columns = make([]int32, len(bad))
		reasons = make([]string, len(bad))
		raws    = make([]string, len(bad))
	)
	for i, e := range LoadErrors(s, bad) {
		keys[i], lines[i], columns[i], reasons[i], raws[i] = e.ObjectKey, e.Line, int32(e.Column), e.Reason, e.Excerpt
	}
	b.Queue(insertErrorsSQL, s.TenantID, s.SourceScope, s.BatchID, keys, lines, columns, reasons, raws, s.BatchUID)
}

// A folder of at most smallLoadRecords records and smallLoadBytes bytes of
// them is a small load (see Load).
const (
	smallLoadRecords = 256
	smallLoadBytes   = 256 << 10
)

// loadHead is the first records of a load, copied out of the reader.
type loadHead struct {
	keys    []string
	lines   []int64
	records []string
}

// readHead reads records from rr while they fit a small load. whole
// reports that rr ended (or failed: see rr.Err) within the limits; when it
// is false, rr's current record is the first one past head.
func readHead(rr *folder.RecordReader) (head loadHead, whole bool) {
	size := 0
	for rr.Next() {
		r := rr.Record()
		if len(head.keys) == smallLoadRecords || size+len(r.JSON) > smallLoadBytes {
			return head, false
		}
		size += len(r.JSON)
		head.keys = append(head.keys, r.ObjectKey)
		head.lines = append(head.lines, r.Line)
		head.records = append(head.records, string(r.JSON))
	}
	return head, true
}

// copySource adapts a folder.RecordReader to pgx.CopyFromSource: the
// records of head first, then rr's current record and the rest. It counts
// the records past head in ledger (head's are counted already).
type copySource struct {
	s      Slice
	rr     *folder.RecordReader
	head   loadHead
	ledger *LedgerCounter
	i      int // the next record of head; past it, rr's
	vals   [6]any
}

func (c *copySource) Next() bool {
	switch {
	case c.i < len(c.head.keys):
		c.i++
		return true
	case c.i == len(c.head.keys):
		// rr's current record is the first past head (readHead).
		c.i++
		return true
	}
	return c.rr.Next()
}

func (c *copySource) Values() ([]any, error) {
	if c.i <= len(c.head.keys) {
		k := c.i - 1
		c.vals = [6]any{c.s.TenantID, c.s.SourceScope, c.s.BatchID, c.head.keys[k], c.head.lines[k], c.head.records[k]}
		return c.vals[:], nil
	}
	r := c.rr.Record()
	c.ledger.Count(r.ObjectKey)
	c.vals = [6]any{c.s.TenantID, c.s.SourceScope, c.s.BatchID, r.ObjectKey, r.Line, r.JSON}
	return c.vals[:], nil
}

func (c *copySource) Err() error { return c.rr.Err() }

// Stamp implements Warehouse.
func (p *Postgres) Stamp(ctx context.Context, tenantID, sourceScope string) (Stamp, bool, error) {
	var st Stamp
	err := p.pool.QueryRow(ctx, `
		SELECT s.batch_id, COALESCE(s.batch_uid, ''), s.lease_generation, s.record_count, s.committed_at, s.published_at, `+badRecordsSQL+`
		FROM curated.fleet_slices s WHERE s.tenant_id = $1 AND s.source_scope = $2`, tenantID, sourceScope).
		Scan(&st.BatchID, &st.BatchUID, &st.Generation, &st.RecordCount, &st.CommittedAt, &st.PublishedAt, &st.BadRecords)
	if errors.Is(err, pgx.ErrNoRows) {
		return Stamp{}, false, nil
	}
	if err != nil {
		return Stamp{}, false, fmt.Errorf("reading warehouse stamp: %w", err)
	}
	return st, true, nil
}

var _ LedgerReader = (*Postgres)(nil)

// badRecordsSQL counts the load errors of the batch the slice s is
// stamped with: the stamp's BadRecords. Errors are replaced with the
// stamp, so the batch id alone tells them apart from no one's.
const badRecordsSQL = `(SELECT count(*) FROM curated.fleet_load_errors e
	  WHERE e.tenant_id = s.tenant_id AND e.source_scope = s.source_scope AND e.batch_id = s.batch_id)`

// ledgerSQL reads a slice's stamp and the ledger rows of the batch it is
// stamped with, in one statement (one snapshot): a stamp without rows is
// the one row of NULL ledger columns.
const ledgerSQL = `
	SELECT s.batch_id, COALESCE(s.batch_uid, ''), s.lease_generation, s.record_count, s.committed_at, s.published_at, ` + badRecordsSQL + `,
	       o.object_key, o.etag, o.size_bytes, o.record_count, o.last_modified, o.marker_modified
	FROM curated.fleet_slices s
	LEFT JOIN curated.fleet_load_objects o
	  ON o.tenant_id = s.tenant_id AND o.source_scope = s.source_scope AND o.batch_id = s.batch_id
	WHERE s.tenant_id = $1 AND s.source_scope = $2
	ORDER BY o.object_key`

// Ledger implements LedgerReader.
func (p *Postgres) Ledger(ctx context.Context, tenantID, sourceScope string) (Stamp, []LedgerObject, bool, error) {
	rows, err := p.pool.Query(ctx, ledgerSQL, tenantID, sourceScope)
	if err != nil {
		return Stamp{}, nil, false, fmt.Errorf("reading the load ledger: %w", err)
	}
	defer rows.Close()
	var (
		st      Stamp
		found   bool
		objects []LedgerObject
	)
	for rows.Next() {
		var (
			key, etag     *string
			size, records *int64
			modified      *time.Time
			o             = LedgerObject{TenantID: tenantID, SourceScope: sourceScope}
		)
		if err := rows.Scan(&st.BatchID, &st.BatchUID, &st.Generation, &st.RecordCount, &st.CommittedAt, &st.PublishedAt, &st.BadRecords,
			&key, &etag, &size, &records, &modified, &o.MarkerModified); err != nil {
			return Stamp{}, nil, false, fmt.Errorf("reading the load ledger: %w", err)
		}
		found = true
		if key == nil {
			continue // a stamp without ledger rows
		}
		o.BatchID, o.BatchUID, o.ObjectKey, o.ETag, o.SizeBytes, o.RecordCount, o.LastModified = st.BatchID, st.BatchUID, *key, *etag, *size, *records, modified.UTC()
		if o.MarkerModified != nil {
			m := o.MarkerModified.UTC()
			o.MarkerModified = &m
		}
		objects = append(objects, o)
	}
	if err := rows.Err(); err != nil {
		return Stamp{}, nil, false, fmt.Errorf("reading the load ledger: %w", err)
	}
	return st, objects, found, nil
}

var _ ErrorsReader = (*Postgres)(nil)

// loadErrorsSQL reads a slice's stamp and the load errors of the batch it
// is stamped with, in one statement (one snapshot): a stamp without errors
// is the one row of NULL error columns.
const loadErrorsSQL = `
	SELECT s.batch_id, COALESCE(s.batch_uid, ''), s.lease_generation, s.record_count, s.committed_at, s.published_at, ` + badRecordsSQL + `,
	       e.ordinal, e.object_key, e.line_number, e.column_number, e.reason, e.raw_excerpt
	FROM curated.fleet_slices s
	LEFT JOIN curated.fleet_load_errors e
	  ON e.tenant_id = s.tenant_id AND e.source_scope = s.source_scope AND e.batch_id = s.batch_id
	WHERE s.tenant_id = $1 AND s.source_scope = $2
	ORDER BY e.ordinal`

// LoadErrors implements ErrorsReader.
func (p *Postgres) LoadErrors(ctx context.Context, tenantID, sourceScope string) (Stamp, []LoadError, bool, error) {
	rows, err := p.pool.Query(ctx, loadErrorsSQL, tenantID, sourceScope)
	if err != nil {
		return Stamp{}, nil, false, fmt.Errorf("reading the load errors: %w", err)
	}
	defer rows.Close()
	var (
		st    Stamp
		found bool
		errs  []LoadError
	)
	for rows.Next() {
		var (
			ordinal, line        *int64
			column               *int32
			key, reason, excerpt *string
		)
		if err := rows.Scan(&st.BatchID, &st.BatchUID, &st.Generation, &st.RecordCount, &st.CommittedAt, &st.PublishedAt, &st.BadRecords,
			&ordinal, &key, &line, &column, &reason, &excerpt); err != nil {
			return Stamp{}, nil, false, fmt.Errorf("reading the load errors: %w", err)
		}
		found = true
		if ordinal == nil {
			continue // a stamp without errors
		}
		errs = append(errs, LoadError{BatchID: st.BatchID, BatchUID: st.BatchUID, TenantID: tenantID, SourceScope: sourceScope, Ordinal: *ordinal,
			ObjectKey: *key, Line: *line, Column: int(*column), Reason: *reason, Excerpt: *excerpt})
	}
	if err := rows.Err(); err != nil {
		return Stamp{}, nil, false, fmt.Errorf("reading the load errors: %w", err)
	}
	return st, errs, found, nil
}

// publishSQL stamps a slice published, keeping the time of an earlier
// publication ($5, when it has one), and records the batch's publication
// in fleet_publications once per batch identity ($3 and the stamp's uid
// $6: a publication of a forgotten batch that was handed the same id does
// not stand for this one; a legacy row, without a uid, names the batch of
// its id); it returns the publication time.
const publishSQL = `
	WITH pub AS (
		UPDATE curated.fleet_slices SET published_at = now()
		WHERE tenant_id = $1 AND source_scope = $2 AND published_at IS NULL
		RETURNING published_at
	), at AS (
		SELECT COALESCE((SELECT published_at FROM pub), $5::timestamptz) AS published_at
	), ins AS (
		INSERT INTO curated.fleet_publications (tenant_id, source_scope, batch_id, batch_uid, record_count, published_at)
		SELECT $1::varchar, $2::varchar, $3::bigint, NULLIF($6::varchar, ''), $4::bigint, at.published_at FROM at
		WHERE NOT EXISTS (
			SELECT 1 FROM curated.fleet_publications
			WHERE tenant_id = $1 AND source_scope = $2 AND batch_id = $3
			  AND (batch_uid IS NULL OR $6::varchar = '' OR batch_uid = $6::varchar))
	)
	SELECT published_at FROM at`

// Publish implements Warehouse.
func (p *Postgres) Publish(ctx context.Context, s Slice, window time.Duration, beforeCommit func(context.Context) error) (Stamp, error) {
	var st Stamp
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		// The slice's lock and the read of its stamp go in one round trip
		// (the read runs once the lock is held).
		//
		// The lock is not redundant with the row lock publishSQL's UPDATE
		// takes: that UPDATE locks the stamp only while published_at is
		// NULL (a re-publication locks nothing), and only after the stamp
		// was read and checked (its batch, its publication window). Without
		// the lock a load of the slice (a successor's, which re-stamps it
		// with published_at NULL) could commit between the read and the
		// UPDATE, and the UPDATE would publish the new stamp on the checks
		// of the old one, recording the old record count. With the fence
		// (warehouse in the operational database) the successor's takeover
		// would abort this transaction at fencePublish; without it (a
		// warehouse on another database) nothing else would. A load takes
		// the same key before the slice's row exists.
		var expired, found bool
		b := &pgx.Batch{}
		b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))`, s.TenantID, s.SourceScope)
		b.Queue(`
			SELECT batch_id, COALESCE(batch_uid, ''), lease_generation, record_count, committed_at, published_at,
			       published_at IS NULL AND now() - committed_at > $3 * interval '1 microsecond'
			FROM curated.fleet_slices WHERE tenant_id = $1 AND source_scope = $2`,
			s.TenantID, s.SourceScope, window.Microseconds()).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&st.BatchID, &st.BatchUID, &st.Generation, &st.RecordCount, &st.CommittedAt, &st.PublishedAt, &expired)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			found = err == nil
			return err
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		switch {
		case !found:
			return ErrSliceMissing
		case !st.Ref().Names(s.Ref()):
			return &SupersededError{Holder: st.Ref(), Generation: st.Generation}
		case expired:
			return fmt.Errorf("%w: committed at %s", ErrPublicationExpired, st.CommittedAt.Format(time.RFC3339))
		}
		// One statement stamps the slice published (unless a previous
		// delivery did) and records the publication once per batch.
		if err := tx.QueryRow(ctx, publishSQL, s.TenantID, s.SourceScope, s.BatchID, st.RecordCount, st.PublishedAt, st.BatchUID).
			Scan(&st.PublishedAt); err != nil {
			return err
		}
		if err := p.checkBeforeFence(ctx, beforeCommit); err != nil {
			return err
		}
		return p.fencePublish(ctx, tx, s, st)
	})
	if err != nil {
		return Stamp{}, err
	}
	return st, nil
}

var _ IDBound = (*Postgres)(nil)

// MaxBatchID implements IDBound. The stamps' and publications' maxima are
// index reads (warehouse migration 00004); the ledger and errors are read
// whole, only with everyTable (worker migrate).
func (p *Postgres) MaxBatchID(ctx context.Context, everyTable bool) (int64, error) {
	var id int64
	err := p.pool.QueryRow(ctx, `
		SELECT GREATEST(
			COALESCE((SELECT max(batch_id) FROM curated.fleet_slices), 0),
			COALESCE((SELECT max(batch_id) FROM curated.fleet_publications), 0),
			CASE WHEN $1::bool THEN COALESCE((SELECT max(batch_id) FROM curated.fleet_load_objects), 0) ELSE 0 END,
			CASE WHEN $1::bool THEN COALESCE((SELECT max(batch_id) FROM curated.fleet_load_errors), 0) ELSE 0 END)`, everyTable).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("reading the largest batch id the warehouse names: %w", err)
	}
	return id, nil
}
