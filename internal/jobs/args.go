package jobs

import (
	"github.com/riverqueue/river"
)

// Queue is the River queue ingest jobs run on.
const Queue = "fleet_ingest"

// MaxAttempts is how many times a job is tried on transient failures before
// its batch is recorded as failed.
const MaxAttempts = 25

// IngestArgs is the River job that asks a worker to continue a batch. Jobs
// carry only the batch id: everything else is read from the batch, under its
// lease. Several jobs for one batch may exist at once (duplicate deliveries,
// resumes, sweeper redeliveries); the lease makes that safe.
type IngestArgs struct {
	BatchID int64 `json:"batch_id"`
	// RedeliveryOf is the lease generation whose expiry made the sweeper
	// insert this job; zero for enqueued and resumed jobs. The sweeper
	// inserts at most one live job per (batch, expired generation): it
	// decides under the batch's row lock, only when no job of the batch is
	// queued and no running job is taking it over (see Sweeper). A second
	// job for the same generation is inserted only when the first one's own
	// delivery died before taking the lease (fetched more than OrphanAfter
	// ago), and in the transaction that marks that dead job cancelled.
	RedeliveryOf int64 `json:"redelivery_of,omitempty"`
}

// Kind implements river.JobArgs.
func (IngestArgs) Kind() string { return "fleet_ingest" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (IngestArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: Queue, MaxAttempts: MaxAttempts}
}
