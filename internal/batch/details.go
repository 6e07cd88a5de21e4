package batch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// DetailsVersion is the version of the details document this code writes and
// understands. A document with another version is never guessed at.
const DetailsVersion = 1

// Phase is the durable progress of a scoped batch, recorded in its details.
type Phase string

// Phases of a Fleet batch. The happy path is reserved → loading → committed
// → publishing → published. The failed_* phases go with status Failed;
// superseded and publication_expired are terminal refusals of a resume.
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
)

// NoWork reports whether a delivery that observes this phase must do nothing,
// whatever the status says.
func (p Phase) NoWork() bool {
	switch p {
	case PhaseSuperseded, PhasePublicationExpired, PhaseFailedPreCommit, PhaseFailedEnqueue:
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
	// UpdatedAt is stamped with the database clock by every store write.
	UpdatedAt *time.Time `json:"updatedAt,omitempty"`
	// Writes is the audit trail of accepted fenced writes, appended by the
	// fenced statement itself. Bounded to the last AuditLimit entries.
	Writes []FencedWrite `json:"writes,omitempty"`
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

// Publication records progress of the post-commit publication.
type Publication struct {
	Started     bool       `json:"started"`
	Completed   bool       `json:"completed"`
	StartedAt   *time.Time `json:"startedAt,omitempty"`
	CompletedAt *time.Time `json:"completedAt,omitempty"`
}

// ErrorRecord is a failure recorded in details. Message never holds secrets:
// callers record sanitized error text.
type ErrorRecord struct {
	Phase   Phase     `json:"phase"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
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
	// does not understand.
	ErrDetailsUnknownVersion = errors.New("batch details have an unknown version")
)

// ParseDetails decodes a details document. It returns ErrDetailsInvalid when
// raw is not a JSON object of the expected shape and ErrDetailsUnknownVersion
// when it is of a version other than DetailsVersion; it never guesses.
func ParseDetails(raw []byte) (Details, error) {
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return Details{}, fmt.Errorf("%w: %v", ErrDetailsInvalid, err)
	}
	if head.Version == nil {
		return Details{}, fmt.Errorf("%w: no version", ErrDetailsInvalid)
	}
	if *head.Version != DetailsVersion {
		return Details{}, fmt.Errorf("%w: version %d", ErrDetailsUnknownVersion, *head.Version)
	}
	var d Details
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&d); err != nil {
		return Details{}, fmt.Errorf("%w: %v", ErrDetailsInvalid, err)
	}
	if d.Phase == "" {
		return Details{}, fmt.Errorf("%w: no phase", ErrDetailsInvalid)
	}
	return d, nil
}

// Marshal encodes the details, forcing the current version.
func (d Details) Marshal() ([]byte, error) {
	d.Version = DetailsVersion
	return json.Marshal(d)
}
