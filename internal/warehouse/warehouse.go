// Package warehouse loads Fleet folders into the warehouse and publishes
// them.
//
// The seam is "load this folder's objects into the tenant/scope slice stamped
// with batch N, atomically", not "stream me rows": production loads into
// Amazon Redshift, which has no COPY … FROM STDIN and loads server-side with
// COPY … FROM 's3://…' IAM_ROLE … (ideally from a MANIFEST naming exactly the
// batch's objects) inside a BEGIN … END that also deletes the old slice and
// stamps the new one. The local implementation, Postgres, streams the same
// objects through COPY FROM STDIN (pgx CopyFrom) inside one transaction; the
// production one, package redshift, stages them in S3 and loads them with
// COPY … MANIFEST through the Redshift Data API. Both pass the same contract
// suite (package warehousetest).
//
// Each load also replaces the slice's load ledger (LedgerObject, table
// curated.fleet_load_objects): one row per object the slice's records came
// from, written in the load's own transaction (Postgres) or its swap
// (Redshift), so it lists exactly the objects of the slice now stamped.
// LedgerReader reads it with the stamp.
//
// The bad records a load skipped within its import's tolerance
// (folder.Source.Tolerate) are recorded the same way, in
// curated.fleet_load_errors (LoadError), replaced with the slice and its
// ledger; the stamp counts them (Stamp.BadRecords) and ErrorsReader lists
// them.
//
// A Redshift COPY can commit after its client session died, so commit
// detection never trusts the client's view: callers read the stamp back
// (Stamp) to learn whether a load committed.
//
// Fencing inside the warehouse: the warehouse is a separate database, so the
// operational lease cannot fence its transactions directly. Instead a load
// refuses to replace a slice stamped by a newer batch (higher id) or by a
// later lease generation of the same batch (ErrSliceSuperseded), and calls
// the caller's beforeCommit hook (a lease check) just before committing. A
// publication writes only while the slice is still stamped with its batch.
//
// Batch identity: every row that names a batch (the stamp, the
// publication, the ledger and the load errors) names it by its id and its
// uid (batch.Ref), because the operational database can go back in time
// while the warehouse does not (a restore, a failover to a standby that
// was behind): its sequence then hands out ids the warehouse still names,
// the uid never repeats. A stamp names this batch only if both agree
// (batch.Ref.Names); a stamp of another batch with a higher or equal id is
// a newer batch's, unless the caller proved the operational database does
// not know that batch (Slice.TakeOver: a forgotten batch, whose stamp the
// load replaces).
package warehouse

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
)

// Slice names what a load writes: the tenant/scope slice stamped with a
// batch and the lease generation it was loaded under.
type Slice struct {
	TenantID    string
	SourceScope string
	BatchID     int64
	// BatchUID is the batch's uid (batch.Batch.UID), stamped beside its
	// id; empty for a legacy batch.
	BatchUID   string
	Generation int64
	// TakeOver, when set, names a batch whose stamp a load may replace
	// although its id is not lower than BatchID: a batch the operational
	// database does not know (batch.Store.Knows), forgotten by a restore
	// or a failover behind the warehouse. Only a stamp naming exactly this
	// id and uid is taken over.
	TakeOver *batch.Ref
	// MarkerModified is the last-modified time of the folder's completion
	// marker, zero when it has none (an import that opted out), written
	// into every ledger row of the load (LedgerObject).
	MarkerModified time.Time
}

// Ref is the identity of the batch the slice is loaded for.
func (s Slice) Ref() batch.Ref { return batch.Ref{ID: s.BatchID, UID: s.BatchUID} }

// Supersedes reports whether cur, the slice's current stamp, holds the
// slice against a load or publication of s: a later generation of the
// same batch, or another batch of a higher or equal id (the same id with
// another uid is a batch the operational database forgot, and is held to
// the same proof) — unless s takes exactly that batch's stamp over.
func Supersedes(cur Stamp, s Slice) bool {
	if t := s.TakeOver; t != nil && cur.BatchID == t.ID && cur.BatchUID == t.UID {
		return false
	}
	if cur.Ref().Names(s.Ref()) {
		return cur.Generation > s.Generation
	}
	return cur.BatchID >= s.BatchID
}

// SupersededError is ErrSliceSuperseded naming the stamp that holds the
// slice, so the caller can ask whether the operational database knows its
// batch (and take a forgotten batch's stamp over, Slice.TakeOver).
type SupersededError struct {
	Holder     batch.Ref
	Generation int64
}

func (e *SupersededError) Error() string {
	return fmt.Sprintf("%v: batch %s generation %d holds it", ErrSliceSuperseded, e.Holder, e.Generation)
}

// Is makes errors.Is(err, ErrSliceSuperseded) true.
func (e *SupersededError) Is(target error) bool { return target == ErrSliceSuperseded }

// LedgerObject is one row of the load ledger, curated.fleet_load_objects:
// a data object of the slice stamped with BatchID, as the load read it.
// The ledger is warehouse data, replaced together with the slice (in the
// load's own transaction, or the Redshift swap), so it always lists
// exactly the objects the slice's records came from.
type LedgerObject struct {
	BatchID int64 `json:"batch_id"`
	// BatchUID is the batch's uid, empty for a row of a legacy batch.
	BatchUID    string `json:"batch_uid,omitempty"`
	TenantID    string `json:"tenant_id"`
	SourceScope string `json:"source_scope"`
	// ObjectKey is the object's full key in its bucket, as the slice's
	// records name it (fleet_records.object_key).
	ObjectKey string `json:"object_key"`
	// ETag is the object's ETag as the store reported it when the load
	// listed the folder (folder.Object.ETag); empty when it reported none.
	ETag        string `json:"etag"`
	SizeBytes   int64  `json:"size_bytes"`
	RecordCount int64  `json:"record_count"`
	// LastModified is the object's last-modified time in the listing.
	LastModified time.Time `json:"last_modified"`
	// MarkerModified is the completion marker's last-modified time
	// (Slice.MarkerModified), nil when the folder had none.
	MarkerModified *time.Time `json:"marker_modified,omitempty"`
}

// LedgerReader reads the load ledger.
type LedgerReader interface {
	// Ledger returns the stamp of the slice (tenantID, sourceScope) and
	// the ledger rows of the batch it is stamped with, in key order, read
	// together (one snapshot); found is false when there is no slice.
	Ledger(ctx context.Context, tenantID, sourceScope string) (st Stamp, objects []LedgerObject, found bool, err error)
}

// LoadError is one row of curated.fleet_load_errors: a bad record the
// load of the slice stamped with BatchID skipped, within its import's
// tolerance, as the reader reported it (folder.BadRecord), like a row of
// Redshift's STL_LOAD_ERRORS.
type LoadError struct {
	BatchID int64 `json:"batch_id"`
	// BatchUID is the batch's uid, empty for a row of a legacy batch.
	BatchUID    string `json:"batch_uid,omitempty"`
	TenantID    string `json:"tenant_id"`
	SourceScope string `json:"source_scope"`
	// Ordinal numbers the slice's bad records from 1, in the order the
	// load read them.
	Ordinal   int64  `json:"ordinal"`
	ObjectKey string `json:"object_key"`
	// Line is the line where the record starts in the object.
	Line int64 `json:"line_number"`
	// Column is 1-based; 0 when the record as a whole was refused.
	Column int    `json:"column_number"`
	Reason string `json:"reason"`
	// Excerpt is the raw value, escaped, at most folder.MaxExcerptBytes.
	Excerpt string `json:"raw_excerpt"`
}

// LoadErrors returns the rows of curated.fleet_load_errors a load of s
// writes for the bad records its reader skipped, in order.
func LoadErrors(s Slice, bad []folder.BadRecord) []LoadError {
	out := make([]LoadError, len(bad))
	for i, b := range bad {
		out[i] = LoadError{BatchID: s.BatchID, BatchUID: s.BatchUID, TenantID: s.TenantID, SourceScope: s.SourceScope, Ordinal: int64(i + 1),
			ObjectKey: b.ObjectKey, Line: b.Line, Column: b.Column, Reason: truncateUTF8(b.Reason, maxReasonBytes), Excerpt: b.Excerpt}
	}
	return out
}

// maxReasonBytes bounds a load error's reason, as both warehouses' tables
// hold it (VARCHAR(1024), bytes in Redshift).
const maxReasonBytes = 1024

// truncateUTF8 cuts s to at most n bytes, at a character boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ErrorsReader reads the load errors table.
type ErrorsReader interface {
	// LoadErrors returns the stamp of the slice (tenantID, sourceScope)
	// and the bad records its load skipped (the rows of
	// curated.fleet_load_errors of the batch it is stamped with), in
	// ordinal order, read together (one snapshot); found is false when
	// there is no slice.
	LoadErrors(ctx context.Context, tenantID, sourceScope string) (st Stamp, errs []LoadError, found bool, err error)
}

// LedgerCounter builds a load's ledger: it counts the records the load
// stores per object (Count, called with each record's ObjectKey, in the
// order the records are read) and returns one LedgerObject per object of
// the load (Objects), zero records included. Times are UTC, to the
// microsecond, as both warehouses store them.
type LedgerCounter struct {
	s       Slice
	objects []LedgerObject
	index   map[string]int
	last    int // the object of the last record counted
}

// NewLedgerCounter returns the counter of a load of objects from src into s.
func NewLedgerCounter(s Slice, src *folder.Source, objects []folder.Object) *LedgerCounter {
	c := &LedgerCounter{s: s, objects: make([]LedgerObject, len(objects)), index: make(map[string]int, len(objects)), last: -1}
	var marker *time.Time
	if !s.MarkerModified.IsZero() {
		m := s.MarkerModified.UTC().Truncate(time.Microsecond)
		marker = &m
	}
	for i, o := range objects {
		key := src.FullKey(o)
		c.objects[i] = LedgerObject{
			BatchID: s.BatchID, BatchUID: s.BatchUID, TenantID: s.TenantID, SourceScope: s.SourceScope, ObjectKey: key,
			ETag: o.ETag, SizeBytes: o.Size, LastModified: o.LastModified.UTC().Truncate(time.Microsecond), MarkerModified: marker,
		}
		c.index[key] = i
	}
	return c
}

// Count counts one record of the object named key.
func (c *LedgerCounter) Count(key string) {
	if c.last < 0 || c.objects[c.last].ObjectKey != key {
		i, ok := c.index[key]
		if !ok {
			return // not an object of the load: the reader reads only those
		}
		c.last = i
	}
	c.objects[c.last].RecordCount++
}

// Objects returns the ledger rows of the load, in the order of its objects.
func (c *LedgerCounter) Objects() []LedgerObject { return c.objects }

// Stamp is the warehouse's record of which batch a slice belongs to.
type Stamp struct {
	BatchID int64
	// BatchUID is the uid the slice is stamped with beside the id; empty
	// for a stamp of a legacy batch or of a release that knew no uids.
	BatchUID    string
	Generation  int64
	RecordCount int64
	// CommittedAt is the warehouse clock at the load's commit.
	CommittedAt time.Time
	// PublishedAt is set once the slice is published.
	PublishedAt *time.Time
	// BadRecords is the number of bad records the load skipped within
	// the import's tolerance (folder.Source.Tolerate), each recorded in
	// the warehouse's errors table (LoadError) with the slice; every
	// stamp read counts them.
	BadRecords int64
}

// Ref is the identity of the batch the slice is stamped with.
func (st Stamp) Ref() batch.Ref { return batch.Ref{ID: st.BatchID, UID: st.BatchUID} }

// Errors of a Warehouse.
var (
	// ErrSliceSuperseded means the slice is stamped with a newer batch (or a
	// later generation of the same batch): a load would overwrite newer data,
	// a publication would publish data that is not this batch's.
	ErrSliceSuperseded = errors.New("warehouse slice is stamped with a newer batch")
	// ErrSliceMissing means there is no slice to publish.
	ErrSliceMissing = errors.New("warehouse slice does not exist")
	// ErrPublicationExpired means the slice was committed longer ago than
	// the publication window allows.
	ErrPublicationExpired = errors.New("publication window has passed")
	// ErrTransient is wrapped by warehouse failures that may go away when the
	// same load or publication is retried: a serialization conflict with a
	// concurrent transaction, an aborted statement, or a statement whose
	// outcome is not known yet (read the stamp back before anything else).
	// pipeline.IsTransient recognises it.
	ErrTransient = errors.New("transient warehouse failure")
)

// StampReader reads slice stamps: all a resume needs of the warehouse.
type StampReader interface {
	// Stamp returns the slice's stamp, and false if there is no slice.
	Stamp(ctx context.Context, tenantID, sourceScope string) (Stamp, bool, error)
}

// Warehouse is where Fleet folders are loaded and published.
type Warehouse interface {
	// Load replaces the slice (s.TenantID, s.SourceScope) with every record
	// of objects, stamped with s, and the slice's load ledger with one row
	// per object (LedgerObject: its records counted as they are loaded,
	// s.MarkerModified) and its load errors with one row per bad record
	// the reader skipped (LoadError, src's tolerance), in one transaction:
	// either the whole new slice is committed, stamped, in the ledger and
	// its errors, or nothing changes; the stamp returned counts the bad
	// records (Stamp.BadRecords). beforeCommit, if
	// not nil, runs just before the commit; its error aborts the load.
	// Returns ErrSliceSuperseded if a newer batch or generation stamped the
	// slice; records that cannot be stored wrap folder.ErrMalformed.
	// beforeCommit is also called before the load fences off other loads of
	// the same slice (see Postgres.Load), so pass a lease check.
	Load(ctx context.Context, s Slice, src *folder.Source, objects []folder.Object, beforeCommit func(context.Context) error) (Stamp, error)
	// Stamp returns the slice's stamp, and false if there is no slice.
	Stamp(ctx context.Context, tenantID, sourceScope string) (Stamp, bool, error)
	// Publish marks the slice published and appends one row to the
	// publications outbox, once per batch; publishing again is a no-op that
	// returns the same stamp. It returns ErrSliceSuperseded when the slice is
	// stamped with another batch, ErrSliceMissing when there is none, and
	// ErrPublicationExpired when an unpublished slice was committed more than
	// window ago by the warehouse clock. beforeCommit, if not nil, runs just
	// before the commit (pass a lease check, so a delivery that lost its
	// lease cannot publish); its error aborts the publication.
	Publish(ctx context.Context, s Slice, window time.Duration, beforeCommit func(context.Context) error) (Stamp, error)
}

// CommitRecorder is implemented by a warehouse that may run the caller's
// Record (WithRecord) in its loads' own transactions. When RecordsCommits
// is true, a load given a Record commits together with it: a slice stamped
// with a batch whose record of the commit is missing cannot exist, so the
// caller need not read the stamp back before a load (package fleet reads
// it only from a warehouse that is not one). Such a load still reads the
// stamp in its own transaction, under the slice's lock: a newer batch's
// or generation's is ErrSliceSuperseded, and an earlier delivery's of the
// same batch (loaded by a build that did not record its commit) is
// replaced.
type CommitRecorder interface {
	RecordsCommits() bool
}

// Verifier adapts a warehouse's stamps to the batch store's resume proof.
func Verifier(w StampReader) batch.SliceVerifier {
	return batch.SliceVerifierFunc(func(ctx context.Context, tenantID, scope string) (batch.Ref, bool, error) {
		st, found, err := w.Stamp(ctx, tenantID, scope)
		return st.Ref(), found, err
	})
}

// Statement is a warehouse statement that may outlive the delivery that
// submitted it: Redshift's Data API runs a submitted statement whatever its
// client does next, and it may commit after the client died. Kind,
// Generation, Attempt and Records identify the submission well enough for a
// later delivery to repeat it idempotently; ID is its id once known.
type Statement struct {
	Kind       string
	ID         string
	Generation int64
	Attempt    int
	Records    int64
}

// Journal is where a warehouse records, durably and with the batch, the
// statement it is about to await, and where a later delivery of the batch
// finds it. The caller (package fleet) keeps it in the batch details,
// fenced on the lease.
type Journal interface {
	// Pending returns the statement a previous delivery recorded and did
	// not see end, if any.
	Pending() (Statement, bool)
	// Record durably records st before it is awaited; the zero Statement
	// clears the record once the statement ended. It returns
	// batch.ErrStaleLease when the lease was lost.
	Record(ctx context.Context, st Statement) error
}

type journalKey struct{}

// WithJournal returns ctx carrying j for the Load or Publish called with
// it. A warehouse whose statements cannot outlive their client ignores it.
func WithJournal(ctx context.Context, j Journal) context.Context {
	return context.WithValue(ctx, journalKey{}, j)
}

// JournalFrom returns the Journal ctx carries, or nil.
func JournalFrom(ctx context.Context) Journal {
	j, _ := ctx.Value(journalKey{}).(Journal)
	return j
}

// StatementWatcher is implemented by a warehouse whose statements can
// outlive their client. A batch whose details record such a statement is
// not settled (pipeline.Settler) while it may still commit.
type StatementWatcher interface {
	// StatementEnded reports whether the recorded statement ended
	// (finished, failed or aborted), or false while it can still commit.
	// A statement whose submission was recorded without an id is never
	// known to have ended.
	StatementEnded(ctx context.Context, st Statement) (bool, error)
}

// Record is a write of the batch's own state that the caller wants
// committed in the same transaction as a warehouse commit (a load or a
// publication): see WithRecord. tx is the warehouse's transaction and st
// the slice's stamp as that transaction leaves it. Record must be fenced on
// the lease (it is the transaction's fence: an error, batch.ErrStaleLease
// for a lost lease, rolls the warehouse commit back with it), and it is the
// lease check before the commit: a warehouse that runs it does not call
// beforeCommit before it, so Record checks what that check would
// (pipeline.Run.CheckpointTx: the safety margin, in the same statement).
type Record func(ctx context.Context, tx pgx.Tx, st Stamp) error

type recordKey struct{}

// WithRecord returns ctx carrying rec for the Load or Publish called with
// it. A warehouse whose transactions reach the operational database (the
// local warehouse with its batch fence, Postgres.WithBatchFence) runs rec
// as the last statement of the transaction, in place of its own fence, so
// the caller's record of the step commits or rolls back with the step
// itself. A warehouse in a database of its own never calls it; the caller
// tells the two apart by whether rec ran in a call that returned nil.
func WithRecord(ctx context.Context, rec Record) context.Context {
	return context.WithValue(ctx, recordKey{}, rec)
}

// RecordFrom returns the Record ctx carries, or nil.
func RecordFrom(ctx context.Context) Record {
	r, _ := ctx.Value(recordKey{}).(Record)
	return r
}

// IDBound is implemented by a warehouse that can say the largest batch id
// it names, so the operational database's id sequence can be moved past
// it (batch.Store.AdvanceIDs) after it went back in time: no id the
// warehouse names is handed out again.
type IDBound interface {
	// MaxBatchID returns the largest batch id a stamp or a publication
	// names and, with everyTable, a ledger or load errors row too (they
	// are replaced with their slice's stamp, so they name no id the stamps
	// and publications do not bound; everyTable reads them all the same);
	// 0 when the warehouse names none.
	MaxBatchID(ctx context.Context, everyTable bool) (int64, error)
}
