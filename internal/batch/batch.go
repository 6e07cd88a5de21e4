package batch

import (
	"errors"
	"strconv"
	"time"
)

// Status is the lifecycle status of a batch, stored by name.
type Status string

// Batch statuses. Running batches with a source scope hold their scope's
// reservation; Succeeded and Failed are terminal for the reservation.
const (
	StatusRunning   Status = "Running"
	StatusSucceeded Status = "Succeeded"
	StatusFailed    Status = "Failed"
)

// SourceType names where a batch's data comes from. Values are stored by
// name; the list is append-only: existing names keep their spelling and order.
type SourceType string

// Source types, in declaration order. Append new ones at the end only.
const (
	SourceTypeBrinkPos SourceType = "BrinkPos"
	SourceTypeKdsCdc   SourceType = "KdsCdc"
	SourceTypeFleetS3  SourceType = "FleetS3"
)

// SourceTypes lists every source type in declaration order. It is
// append-only; a golden test guards the existing entries.
var SourceTypes = []SourceType{SourceTypeBrinkPos, SourceTypeKdsCdc, SourceTypeFleetS3}

// IngestionMode says how a batch's data arrives, stored by name.
type IngestionMode string

// Ingestion modes, in declaration order. Append-only like SourceType.
const (
	IngestionModeAPI        IngestionMode = "Api"
	IngestionModeCDC        IngestionMode = "Cdc"
	IngestionModeFileUpload IngestionMode = "FileUpload"
)

// IngestionModes lists every ingestion mode in declaration order.
var IngestionModes = []IngestionMode{IngestionModeAPI, IngestionModeCDC, IngestionModeFileUpload}

// PipelineStageFleet is the pipeline stage of every Fleet batch.
const PipelineStageFleet = "fleet_s3_direct_to_curated"

// Batch is one row of ingestion_batches.
type Batch struct {
	ID             int64
	CompanyID      string
	TenantID       string
	TenantDatabase string
	IngestionMode  IngestionMode
	SourceType     SourceType
	// BusinessDate is nil for batches that are not date-scoped (Fleet).
	BusinessDate  *time.Time
	PipelineStage string
	Status        Status
	IsCurrent     bool
	// Details is the raw versioned JSON document; see ParseDetails.
	Details     []byte
	StartedAt   time.Time
	CompletedAt *time.Time
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// SourceScope is nil for batches that reserve no scope (date-scoped ones).
	SourceScope *string
	// LeaseID, LeaseExpiresAt and LeaseGeneration describe the execution
	// lease. LeaseID is nil when no delivery holds it. LeaseGeneration counts
	// every acquisition and never decreases.
	LeaseID         *string
	LeaseExpiresAt  *time.Time
	LeaseGeneration int64
	// LeaseRenewedAt is the database time of the lease's last acquisition
	// or renewal, nil if it was never leased.
	LeaseRenewedAt *time.Time
	// ParkedAt and ParkedReason are set when a delivery found the batch
	// Running but could not work on it (see Store.Park): the sweeper leaves
	// it alone until an operator cancels it.
	ParkedAt     *time.Time
	ParkedReason *string
	// CancelledAt, CancelledBy and CancelReason record an operator's
	// cancel (see Store.Cancel).
	CancelledAt  *time.Time
	CancelledBy  *string
	CancelReason *string
	// UID is the batch's random identity (a UUID, migration 00100), which
	// the warehouse stamps beside the id and tenants receive: unlike the id
	// it cannot be handed out again after the operational database went
	// back in time (see Ref). Empty for a batch written before the column
	// existed (a legacy batch, named by its id alone).
	UID string
}

// Ref is the batch's identity as the warehouse and tenants hold it.
func (b Batch) Ref() Ref { return Ref{ID: b.ID, UID: b.UID} }

// Ref names a batch beyond the operational database's memory: its id and
// its uid. The id alone can repeat after a restore or a failover to a
// standby that was behind (the sequence goes back with the database); the
// uid cannot. An empty UID is a legacy name (a row or a stamp written
// before uids existed, or by a release that does not know them), which
// names the batch of that id.
type Ref struct {
	ID  int64
	UID string
}

// Names reports whether r and o name the same batch: the same id and,
// unless either is a legacy name, the same uid.
func (r Ref) Names(o Ref) bool {
	return r.ID == o.ID && (r.UID == "" || o.UID == "" || r.UID == o.UID)
}

// String is the ref as logs and errors show it: "7 (uid 6f1c…)", or the
// id alone for a legacy name.
func (r Ref) String() string {
	if r.UID == "" {
		return strconv.FormatInt(r.ID, 10)
	}
	return strconv.FormatInt(r.ID, 10) + " (uid " + r.UID + ")"
}

// Parked reports whether the batch is Running and parked: no delivery will
// work on it until an operator acts.
func (b *Batch) Parked() bool { return b.Status == StatusRunning && b.ParkedAt != nil }

// Scope returns the batch's source scope, or "" when it has none.
func (b *Batch) Scope() string {
	if b.SourceScope == nil {
		return ""
	}
	return *b.SourceScope
}

// Terminal reports whether no delivery may work on the batch any more. A
// batch is terminal when its status is not Running.
func (b *Batch) Terminal() bool { return b.Status != StatusRunning }

// Fence identifies the exact execution lease term a write is made under.
// Every state write a lease holder makes is conditional on the batch still
// being Running and still held by this lease id and generation, unexpired by
// the database clock.
type Fence struct {
	BatchID    int64
	LeaseID    string
	Generation int64
	// Margin, when positive, also requires more than it left of the term
	// by the database clock (clock_timestamp() + Margin): the lease check
	// before a commit made by the write itself (pipeline.Run.CheckpointTx).
	Margin time.Duration
}

// Errors returned by the store. Expected domain outcomes of Reserve and
// Resume are results, not errors; these are for lookups and fenced writes.
var (
	// ErrNotFound is returned when no batch has the requested id.
	ErrNotFound = errors.New("batch not found")
	// ErrStaleLease is returned by a fenced write when the writer no longer
	// holds the lease term it names: the lease expired, was taken over by
	// another delivery, or the batch left Running. Nothing was written.
	ErrStaleLease = errors.New("execution lease no longer held: write rejected")
	// ErrNotDateScoped is returned by the is_current helpers for a batch with
	// no business date.
	ErrNotDateScoped = errors.New("batch has no business date: current-batch helpers apply to date-scoped batches only")
	// ErrScopedBatch is returned by the generic, unfenced updates
	// (UpdateStatus, UpdateDetails, UpdateStatusAndDetails) for a batch with
	// a source scope: such a write would bypass the lease fence, the scope
	// reservation and the resume rules. Nothing was written.
	ErrScopedBatch = errors.New("batch has a source scope: generic updates apply to date-scoped batches only")
	// ErrUnexpectedBatch is returned by GetForUpdate when the batch does not
	// match the caller's expectation; the error text names the field.
	ErrUnexpectedBatch = errors.New("batch does not match expectation")
)
