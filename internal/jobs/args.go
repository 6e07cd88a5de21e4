package jobs

import (
	"strconv"
	"strings"

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

// maxTagLen is River's longest tag.
const maxTagLen = 255

// Tags are the River tags of a batch's jobs, so that the River UI lists
// and filters them by tenant and by batch: "tenant_<tenant id>" and
// "batch_<id>". River accepts letters, digits, "_" and "-" in a tag
// (starting and ending with a letter, digit or "_"); any other character
// of a tenant id becomes "-", so two tenant ids that differ only there
// share a tag (the UI filter then lists both; the batch is the authority).
func Tags(tenantID string, batchID int64) []string {
	return []string{tag("tenant_", tenantID), "batch_" + strconv.FormatInt(batchID, 10)}
}

func tag(prefix, v string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for _, r := range v {
		if b.Len() >= maxTagLen-1 {
			break
		}
		if r == '_' || r == '-' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	out := b.String()
	if strings.HasSuffix(out, "-") {
		out += "_"
	}
	return out
}

// insertOpts are the per-job insert options of a batch's job: its tags.
// Queue and attempts come from IngestArgs.InsertOpts.
func insertOpts(tenantID string, batchID int64) *river.InsertOpts {
	return &river.InsertOpts{Tags: Tags(tenantID, batchID)}
}
