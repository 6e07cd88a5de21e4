package batch

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// DetailsVersion is the version of the details document this code writes and
// understands. A document with another version is never guessed at.
//
// Two releases run side by side during every deploy, so a document one
// writes must be readable by the one before it. Within a version a newer
// build may add keys (informational ones: summaries, audit): this build
// keeps the keys it does not know through its own writes (members) and
// ignores them otherwise. A change an older build cannot honour (new phase
// semantics, a key whose absence makes older code do the wrong thing, a
// changed meaning) bumps the version; a build that meets a version newer
// than its own leaves the batch to a newer build (ErrDetailsNewerVersion;
// docs/reliability.md, "Two releases at once").
const DetailsVersion = 1

// Phase is the durable progress of a scoped batch, recorded in its details.
type Phase string

// Phases of a Fleet batch. The happy path is reserved → loading → committed
// → publishing → published. The failed_* phases go with status Failed;
// superseded and publication_expired are terminal refusals of a resume;
// cancelled is an operator's cancel (see Store.Cancel). The list is
// append-only, like the enums: names keep their spelling.
const (
	PhaseReserved           Phase = "reserved"
	PhaseLoading            Phase = "loading"
	PhaseCommitted          Phase = "committed"
	PhasePublishing         Phase = "publishing"
	PhasePublished          Phase = "published"
	PhaseFailedEnqueue      Phase = "failed_enqueue"
	PhaseFailedPreCommit    Phase = "failed_pre_commit"
	PhaseFailedPublication  Phase = "failed_publication"
	PhaseSuperseded         Phase = "superseded"
	PhasePublicationExpired Phase = "publication_expired"
	PhaseCancelled          Phase = "cancelled"
)

// Phases lists every phase this build knows, in declaration order. It is
// append-only; a golden test guards the existing entries.
var Phases = []Phase{
	PhaseReserved, PhaseLoading, PhaseCommitted, PhasePublishing, PhasePublished,
	PhaseFailedEnqueue, PhaseFailedPreCommit, PhaseFailedPublication, PhaseSuperseded,
	PhasePublicationExpired, PhaseCancelled,
}

// Known reports whether this build knows the phase.
func (p Phase) Known() bool {
	for _, k := range Phases {
		if p == k {
			return true
		}
	}
	return false
}

// NoWork reports whether a delivery that observes this phase must do nothing,
// whatever the status says.
func (p Phase) NoWork() bool {
	switch p {
	case PhaseSuperseded, PhasePublicationExpired, PhaseFailedPreCommit, PhaseFailedEnqueue, PhaseCancelled:
		return true
	}
	return false
}

// Details is the versioned JSON document stored in ingestion_batches.details
// for scoped batches. It records what a later delivery or a resume needs to
// know: the phase, whether the warehouse commit happened, publication
// progress and the last error.
type Details struct {
	Version int   `json:"version"`
	Phase   Phase `json:"phase"`
	// SourceFolder is the canonical folder the batch loads.
	SourceFolder string `json:"sourceFolder,omitempty"`
	// RedshiftCommitted is true once the warehouse slice is committed and
	// stamped with this batch's id.
	RedshiftCommitted bool `json:"redshiftCommitted"`
	// CommittedAt is the warehouse's own commit time of the slice.
	CommittedAt *time.Time `json:"committedAt,omitempty"`
	// RecordCount is the number of records in the committed slice.
	RecordCount int64       `json:"recordCount,omitempty"`
	Publication Publication `json:"publication"`
	// LastError is the most recent failure recorded for the batch.
	LastError *ErrorRecord `json:"lastError,omitempty"`
	// Resumes counts how many times a failed publication was resumed.
	Resumes int `json:"resumes,omitempty"`
	// RetryOf is the batch this one retries (enqueue retry), if any.
	RetryOf int64 `json:"retryOf,omitempty"`
	// Progress is how far the current load got, sampled while it runs.
	Progress *Progress `json:"progress,omitempty"`
	// WarehouseStatement is the warehouse statement a delivery submitted
	// (or was about to submit) and has not yet seen end, recorded before it
	// is awaited: a warehouse statement runs whatever its client does, so a
	// later delivery follows it to its end instead of submitting another
	// while it can still commit. Absent in documents of older builds.
	WarehouseStatement *WarehouseStatement `json:"warehouseStatement,omitempty"`
	// MarkerOptional is an import's explicit opt-out of the completion
	// marker (for producers that write none): the worker loads the folder
	// without it. Absent (false), a folder without its marker is not
	// loaded (ReasonFolderIncomplete).
	MarkerOptional bool `json:"markerOptional,omitempty"`
	// MaxBadRecords is the import's tolerance of bad records (COPY's
	// MAXERROR): up to this many records that cannot be stored are
	// skipped, each recorded with the slice in the warehouse's errors
	// table; one more fails the batch. 0 (absent): the first fails it.
	MaxBadRecords int `json:"maxBadRecords,omitempty"`
	// Objects summarizes the objects the load read, recorded with the
	// commit: what the operational side compares a folder's listing with
	// (reconcile's late and changed files) without reading the warehouse,
	// whose ledger lists them one by one.
	Objects *ObjectsSummary `json:"objects,omitempty"`
	// TookOver names the batch whose warehouse stamp this batch's load
	// replaced although the slice named it as newer: a batch the
	// operational database did not know (forgotten by a restore or a
	// failover behind the warehouse). Recorded with the commit.
	TookOver *TakenOver `json:"tookOver,omitempty"`
	// UpdatedAt is stamped with the database clock by every store write.
	UpdatedAt *time.Time `json:"updatedAt,omitempty"`
	// Writes is the audit trail of accepted fenced writes, appended by the
	// fenced statement itself. Bounded to the last AuditLimit entries.
	Writes []FencedWrite `json:"writes,omitempty"`

	// legacyLeases is the lease trail as builds before migration 30 kept it
	// in details (the trail is now the column execution_lease_terms). Such
	// a document is still read, from a finished batch's history or from an
	// older worker of a rolling upgrade; the key is checked like any other,
	// then dropped (always nil after ParseDetails): this build never
	// writes it.
	LegacyLeases []legacyLeaseTerm `json:"leases,omitempty"`

	rest members // keys of a newer build, kept (see members)
}

// legacyLeaseTerm is a term of the lease trail in details before
// migration 30.
type legacyLeaseTerm struct {
	LeaseID    string     `json:"leaseId"`
	Generation int64      `json:"generation"`
	At         time.Time  `json:"at"`
	ExpiresAt  time.Time  `json:"expiresAt"`
	ReleasedAt *time.Time `json:"releasedAt,omitempty"`
	Renewals   int64      `json:"renewals,omitempty"`
}

// AuditLimit bounds the audit trails the database keeps: details.writes
// here and the lease terms of execution_lease_terms (package lease).
const AuditLimit = 16

// FencedWrite is one accepted state write of a lease holder.
type FencedWrite struct {
	Phase      Phase     `json:"phase"`
	Status     Status    `json:"status"`
	LeaseID    string    `json:"leaseId"`
	Generation int64     `json:"generation"`
	At         time.Time `json:"at"`
}

// Progress is how far a load got: objects and records read into the
// warehouse load so far, sampled at most every few seconds by the delivery
// holding the lease. It describes the load in flight; once the load commits
// RecordCount is the authority.
type Progress struct {
	ObjectsDone  int64     `json:"objectsDone"`
	ObjectsTotal int64     `json:"objectsTotal"`
	RecordsDone  int64     `json:"recordsDone"`
	At           time.Time `json:"at"`

	rest members
}

// WarehouseStatement is a submitted warehouse statement (see
// Details.WarehouseStatement). Its fields mean what the warehouse that
// wrote it says (package warehouse, Statement).
type WarehouseStatement struct {
	// Kind says what the statement does (a load's COPY or swap, or a
	// publication).
	Kind string `json:"kind"`
	// ID is the statement's id, empty while only its submission is
	// recorded (the submission's answer was not yet seen).
	ID string `json:"id,omitempty"`
	// Generation is the lease generation of the delivery that submitted
	// it.
	Generation int64 `json:"generation"`
	// Attempt numbers the submissions of one kind by one delivery; with
	// Kind and Generation it makes the submission's idempotency token.
	Attempt int `json:"attempt,omitempty"`
	// Records is the number of records the statement loads, for a load.
	Records int64 `json:"records,omitempty"`
	// SubmittedAt is when it was recorded.
	SubmittedAt time.Time `json:"submittedAt"`

	rest members
}

// Publication records progress of the post-commit publication.
type Publication struct {
	Started     bool       `json:"started"`
	Completed   bool       `json:"completed"`
	StartedAt   *time.Time `json:"startedAt,omitempty"`
	CompletedAt *time.Time `json:"completedAt,omitempty"`

	rest members
}

// ErrorRecord is a failure recorded in details. Message never holds secrets:
// callers record sanitized error text.
type ErrorRecord struct {
	Phase Phase `json:"phase"`
	// Reason names the kind of failure where one is distinguished
	// (ReasonFolderIncomplete, …); empty otherwise.
	Reason  Reason    `json:"reason,omitempty"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`

	rest members
}

// Reason names a kind of failure within a phase, for status, list, the
// metrics and the HTTP answers. The list is append-only.
type Reason string

// Reasons of a failure.
const (
	// ReasonFolderIncomplete: the folder holds no completion marker and
	// the import did not opt out of it (Details.MarkerOptional); nothing
	// was written to the warehouse.
	ReasonFolderIncomplete Reason = "folder_incomplete"
	// ReasonBadRecords: the folder holds more records that cannot be
	// stored than the import tolerates (Details.MaxBadRecords, 0 by
	// default); the error names the last one's object, line and column.
	ReasonBadRecords Reason = "bad_records"
)

// ObjectsSummary summarizes the objects of a load (Details.Objects).
type ObjectsSummary struct {
	// Count and Bytes are the number and total size of the data objects.
	Count int64 `json:"count"`
	Bytes int64 `json:"bytes"`
	// NewestModified is the newest last-modified time among them.
	NewestModified *time.Time `json:"newestModified,omitempty"`
	// Digest is the hex SHA-256 of the objects' keys and ETags
	// (folder.Digest), equal for two listings of the same content.
	Digest string `json:"digest"`
	// Marker is the completion marker's name and MarkerModified its
	// last-modified time, when the folder had one.
	Marker         string     `json:"marker,omitempty"`
	MarkerModified *time.Time `json:"markerModified,omitempty"`
	// Late counts the objects modified after the marker (loaded all the
	// same: they were in the listing).
	Late int64 `json:"late,omitempty"`
	// BadRecords counts the bad records the load skipped, within the
	// import's tolerance (Details.MaxBadRecords).
	BadRecords int64 `json:"badRecords,omitempty"`

	rest members
}

// TakenOver is a forgotten batch's stamp a load took over (Details.TookOver).
type TakenOver struct {
	BatchID  int64  `json:"batchId"`
	BatchUID string `json:"batchUid,omitempty"`
	// Generation is the lease generation the stamp named.
	Generation int64     `json:"generation"`
	At         time.Time `json:"at"`

	rest members
}

// NewDetails returns the initial details of a scoped batch reservation.
func NewDetails(sourceFolder string) Details {
	return Details{Version: DetailsVersion, Phase: PhaseReserved, SourceFolder: sourceFolder}
}

// Errors returned by ParseDetails.
var (
	// ErrDetailsInvalid means the document is not JSON or does not have the
	// shape of its version.
	ErrDetailsInvalid = errors.New("batch details are not a valid details document")
	// ErrDetailsUnknownVersion means the document names a version this code
	// does not understand, older or newer.
	ErrDetailsUnknownVersion = errors.New("batch details have an unknown version")
	// ErrDetailsNewerVersion means the document names a version newer than
	// this build's: a newer build wrote it, with a change this build cannot
	// honour. Such a batch is a newer build's to work on (a delivery
	// leaves it, see package pipeline). It matches ErrDetailsUnknownVersion
	// too.
	ErrDetailsNewerVersion = errors.New("batch details are of a newer version than this build's")
)

// UnknownVersionError is the error of ParseDetails for a document of a
// version this build does not know. It matches ErrDetailsUnknownVersion,
// and ErrDetailsNewerVersion when the version is newer than DetailsVersion.
type UnknownVersionError struct{ Version int }

func (e *UnknownVersionError) Error() string {
	if e.Newer() {
		return fmt.Sprintf("details version %d is newer than this build's (%d)", e.Version, DetailsVersion)
	}
	return fmt.Sprintf("details version %d unknown to this build", e.Version)
}

// Newer reports whether the version is newer than this build's.
func (e *UnknownVersionError) Newer() bool { return e.Version > DetailsVersion }

// Is makes errors.Is(err, ErrDetailsUnknownVersion) true, and
// errors.Is(err, ErrDetailsNewerVersion) for a newer version.
func (e *UnknownVersionError) Is(target error) bool {
	return target == ErrDetailsUnknownVersion || (target == ErrDetailsNewerVersion && e.Newer())
}

// ParseDetails decodes a details document. It returns ErrDetailsInvalid when
// raw is not a JSON object of the expected shape and an UnknownVersionError
// (ErrDetailsUnknownVersion; ErrDetailsNewerVersion when newer) when it is
// of a version other than DetailsVersion; it never guesses.
//
// Keys this build does not know are a newer build's additions within the
// version (see DetailsVersion): they are accepted, at the top level and in
// every nested object, ignored, and kept in the value, so that Marshal
// writes them back. What is ambiguous or broken is refused: a known key
// spelt in another case ("Phase"; encoding/json alone would take it for
// "phase"), a key that repeats, a value of the wrong type, a phase this
// build does not know, a document without a version or a phase.
func ParseDetails(raw []byte) (Details, error) {
	if !json.Valid(raw) {
		var v any
		return Details{}, fmt.Errorf("%w: %v", ErrDetailsInvalid, json.Unmarshal(raw, &v))
	}
	ms, err := splitObject(raw)
	if err != nil {
		return Details{}, fmt.Errorf("%w: %v", ErrDetailsInvalid, err)
	}
	version, err := versionOf(ms)
	if err != nil {
		return Details{}, fmt.Errorf("%w: %v", ErrDetailsInvalid, err)
	}
	if version != DetailsVersion {
		return Details{}, &UnknownVersionError{Version: version}
	}
	var d Details
	if d.rest, err = decodeMembers(raw, ms, (*plainDetails)(&d)); err != nil {
		return Details{}, fmt.Errorf("%w: %v", ErrDetailsInvalid, err)
	}
	if d.Phase == "" {
		return Details{}, fmt.Errorf("%w: no phase", ErrDetailsInvalid)
	}
	if err := d.checkPhases(); err != nil {
		return Details{}, fmt.Errorf("%w: %v", ErrDetailsInvalid, err)
	}
	d.LegacyLeases = nil
	return d, nil
}

// versionOf reads the version of a details document from its top-level
// members ms: the key "version", spelt exactly, once, an integer. The rest
// of the document is not looked at here: its shape is the version's.
func versionOf(ms []member) (int, error) {
	var version *int
	for _, m := range ms {
		switch {
		case m.key == "version" && version != nil:
			return 0, errors.New(`key "version" repeated`)
		case m.key == "version":
			if err := json.Unmarshal(m.value, &version); err != nil {
				return 0, fmt.Errorf("version: %w", err)
			}
			if version == nil {
				return 0, errors.New("no version")
			}
		case strings.EqualFold(m.key, "version"):
			return 0, fmt.Errorf(`key %q is the key "version" spelt in another case`, m.key)
		}
	}
	if version == nil {
		return 0, errors.New("no version")
	}
	return *version, nil
}

// checkPhases refuses phases this build does not know.
func (d *Details) checkPhases() error {
	if !d.Phase.Known() {
		return fmt.Errorf("unknown phase %q", d.Phase)
	}
	if d.LastError != nil && !d.LastError.Phase.Known() {
		return fmt.Errorf("lastError: unknown phase %q", d.LastError.Phase)
	}
	for i, w := range d.Writes {
		if !w.Phase.Known() {
			return fmt.Errorf("writes[%d]: unknown phase %q", i, w.Phase)
		}
	}
	return nil
}

// Marshal encodes the details, forcing the current version. Keys of a
// newer build that the document was read with are written back (see
// members).
func (d Details) Marshal() ([]byte, error) {
	d.Version = DetailsVersion
	return json.Marshal(d)
}

// The details types decode with decodeObject and encode with encodeObject
// (see members): each keeps the keys a newer build added to its object.
// Their plain forms, without methods, are what encoding/json sees.
type (
	plainDetails            Details
	plainPublication        Publication
	plainErrorRecord        ErrorRecord
	plainProgress           Progress
	plainWarehouseStatement WarehouseStatement
	plainObjectsSummary     ObjectsSummary
	plainTakenOver          TakenOver
	plainFencedWrite        FencedWrite
	plainLegacyLeaseTerm    legacyLeaseTerm
)

// UnmarshalJSON implements json.Unmarshaler (see decodeObject).
func (d *Details) UnmarshalJSON(raw []byte) (err error) {
	d.rest, err = decodeObject(raw, (*plainDetails)(d))
	return err
}

// MarshalJSON implements json.Marshaler (see encodeObject).
func (d Details) MarshalJSON() ([]byte, error) { return encodeObject(plainDetails(d), d.rest) }

// UnmarshalJSON implements json.Unmarshaler (see decodeObject).
func (p *Publication) UnmarshalJSON(raw []byte) (err error) {
	p.rest, err = decodeObject(raw, (*plainPublication)(p))
	return err
}

// MarshalJSON implements json.Marshaler (see encodeObject).
func (p Publication) MarshalJSON() ([]byte, error) {
	return encodeObject(plainPublication(p), p.rest)
}

// UnmarshalJSON implements json.Unmarshaler (see decodeObject).
func (e *ErrorRecord) UnmarshalJSON(raw []byte) (err error) {
	e.rest, err = decodeObject(raw, (*plainErrorRecord)(e))
	return err
}

// MarshalJSON implements json.Marshaler (see encodeObject).
func (e ErrorRecord) MarshalJSON() ([]byte, error) {
	return encodeObject(plainErrorRecord(e), e.rest)
}

// UnmarshalJSON implements json.Unmarshaler (see decodeObject).
func (p *Progress) UnmarshalJSON(raw []byte) (err error) {
	p.rest, err = decodeObject(raw, (*plainProgress)(p))
	return err
}

// MarshalJSON implements json.Marshaler (see encodeObject).
func (p Progress) MarshalJSON() ([]byte, error) { return encodeObject(plainProgress(p), p.rest) }

// UnmarshalJSON implements json.Unmarshaler (see decodeObject).
func (w *WarehouseStatement) UnmarshalJSON(raw []byte) (err error) {
	w.rest, err = decodeObject(raw, (*plainWarehouseStatement)(w))
	return err
}

// MarshalJSON implements json.Marshaler (see encodeObject).
func (w WarehouseStatement) MarshalJSON() ([]byte, error) {
	return encodeObject(plainWarehouseStatement(w), w.rest)
}

// UnmarshalJSON implements json.Unmarshaler (see decodeObject).
func (o *ObjectsSummary) UnmarshalJSON(raw []byte) (err error) {
	o.rest, err = decodeObject(raw, (*plainObjectsSummary)(o))
	return err
}

// MarshalJSON implements json.Marshaler (see encodeObject).
func (o ObjectsSummary) MarshalJSON() ([]byte, error) {
	return encodeObject(plainObjectsSummary(o), o.rest)
}

// UnmarshalJSON implements json.Unmarshaler (see decodeObject).
func (t *TakenOver) UnmarshalJSON(raw []byte) (err error) {
	t.rest, err = decodeObject(raw, (*plainTakenOver)(t))
	return err
}

// MarshalJSON implements json.Marshaler (see encodeObject).
func (t TakenOver) MarshalJSON() ([]byte, error) { return encodeObject(plainTakenOver(t), t.rest) }

// UnmarshalJSON implements json.Unmarshaler (see decodeObject). The keys of
// an entry this build does not know are checked and dropped: the write
// trail is the database's (the fenced statement keeps the stored entries
// and drops the writer's copy, see fencedUpdate), so a newer build's
// members of an entry stay in the database whatever this build sends.
func (w *FencedWrite) UnmarshalJSON(raw []byte) error {
	_, err := decodeObject(raw, (*plainFencedWrite)(w))
	return err
}

// UnmarshalJSON implements json.Unmarshaler (see decodeObject). The legacy
// trail is dropped after parsing; its terms are checked like any object.
func (l *legacyLeaseTerm) UnmarshalJSON(raw []byte) error {
	_, err := decodeObject(raw, (*plainLegacyLeaseTerm)(l))
	return err
}
