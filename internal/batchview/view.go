// Package batchview is how a batch is shown to its readers: enqueue status
// and list, and the door's GET /v1/batches routes share one schema.
package batchview

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
)

// View is what enqueue status and list, and the door's GET /v1/batches
// routes, show of a batch: one schema for every reader. Durations are
// numbers of seconds; times are RFC 3339.
type View struct {
	BatchID int64 `json:"batch_id"`
	// BatchUID is the batch's uid (absent for a batch written before uids
	// existed): its name for good, which no restore of the coordinator's
	// database hands out again, as it may the id.
	BatchUID          string `json:"batch_uid,omitempty"`
	TenantID          string `json:"tenant_id"`
	SourceType        string `json:"source_type"`
	SourceScope       string `json:"source_scope,omitempty"`
	SourceFolder      string `json:"source_folder,omitempty"`
	Status            string `json:"status"`
	Phase             string `json:"phase,omitempty"`
	RedshiftCommitted bool   `json:"redshift_committed"`
	RecordCount       int64  `json:"record_count,omitempty"`
	// Progress of the load in flight (or the last one), from details.
	ObjectsDone  *int64     `json:"objects_done,omitempty"`
	ObjectsTotal *int64     `json:"objects_total,omitempty"`
	RecordsDone  *int64     `json:"records_done,omitempty"`
	ProgressAt   *time.Time `json:"progress_at,omitempty"`
	LeaseHolder  string     `json:"lease_holder,omitempty"`
	// LeaseExpiresInSeconds is negative once the lease has expired.
	LeaseExpiresAt         *time.Time `json:"lease_expires_at,omitempty"`
	LeaseExpiresInSeconds  *float64   `json:"lease_expires_in_seconds,omitempty"`
	LeaseRenewedAt         *time.Time `json:"lease_renewed_at,omitempty"`
	LeaseRenewedSecondsAgo *float64   `json:"lease_renewed_seconds_ago,omitempty"`
	LeaseGeneration        int64      `json:"lease_generation"`
	Parked                 bool       `json:"parked"`
	ParkedReason           string     `json:"parked_reason,omitempty"`
	ParkedAt               *time.Time `json:"parked_at,omitempty"`
	CancelledAt            *time.Time `json:"cancelled_at,omitempty"`
	CancelledBy            string     `json:"cancelled_by,omitempty"`
	CancelReason           string     `json:"cancel_reason,omitempty"`
	StartedAt              time.Time  `json:"started_at"`
	CompletedAt            *time.Time `json:"completed_at,omitempty"`
	AgeSeconds             float64    `json:"age_seconds"`
	LastError              string     `json:"last_error,omitempty"`
	// Reason names the kind of the last failure where one is
	// distinguished (batch.Reason: folder_incomplete, …).
	Reason string `json:"reason,omitempty"`
	// Objects summarizes the objects the load read (the details' objects),
	// when the worker recorded it.
	Objects      *Objects `json:"objects,omitempty"`
	DetailsError string   `json:"details_error,omitempty"`
	// TookOver names the batch whose warehouse stamp this batch's load
	// took over although the slice named it as newer: a batch the
	// operational database did not know (forgotten by a restore or a
	// failover behind the warehouse).
	TookOver *TookOver `json:"took_over,omitempty"`
	// RetryOf is the batch this one retries (enqueue retry); RetriedBy the
	// batches that retry this one.
	RetryOf   int64   `json:"retry_of,omitempty"`
	RetriedBy []int64 `json:"retried_by,omitempty"`
	// SupersededBy is the newest batch of the same folder when this one is
	// not it (a later import, re-import or retry of the folder): a Failed
	// batch with SupersededBy is no longer the folder's state. Set by
	// AddLinks.
	SupersededBy int64 `json:"superseded_by,omitempty"`
	// RiverJobs are the batch's River jobs still in river_job (River
	// deletes finalized jobs after its retention: a day for completed
	// ones), oldest first: the ids the River UI shows and operators act on.
	RiverJobs []jobs.JobRef `json:"river_jobs,omitempty"`
	// QueuePaused names the paused River queue a Running batch waits in:
	// one of its jobs waits there to be worked (available, scheduled,
	// retryable or pending), and no worker takes it until the queue is
	// resumed. Set by AddPausedQueues (enqueue status and list).
	QueuePaused string `json:"queue_paused,omitempty"`
	// RecordsPerSecond and ETASeconds are status --watch's estimate, from
	// the load's progress since the watch began.
	RecordsPerSecond *float64 `json:"records_per_second,omitempty"`
	ETASeconds       *float64 `json:"eta_seconds,omitempty"`
}

// Objects is what a View shows of a load's objects summary
// (batch.ObjectsSummary).
type Objects struct {
	Count          int64      `json:"count"`
	Bytes          int64      `json:"bytes"`
	NewestModified *time.Time `json:"newest_modified,omitempty"`
	Digest         string     `json:"digest"`
	Marker         string     `json:"marker,omitempty"`
	MarkerModified *time.Time `json:"marker_modified,omitempty"`
	Late           int64      `json:"late,omitempty"`
	// BadRecords counts the bad records the load skipped within the
	// import's tolerance (status --errors lists them).
	BadRecords int64 `json:"bad_records,omitempty"`
}

// TookOver is what a View shows of a forgotten batch's stamp the load
// took over (batch.TakenOver).
type TookOver struct {
	BatchID    int64     `json:"batch_id"`
	BatchUID   string    `json:"batch_uid,omitempty"`
	Generation int64     `json:"lease_generation"`
	At         time.Time `json:"at"`
}

func seconds(d time.Duration) *float64 {
	f := d.Round(time.Millisecond).Seconds()
	return &f
}

// Of is the View of b at now (the database clock, or the reader's).
func Of(b batch.Batch, now time.Time) View {
	v := View{
		BatchID: b.ID, BatchUID: b.UID, TenantID: b.TenantID, SourceType: string(b.SourceType), SourceScope: b.Scope(),
		Status: string(b.Status), LeaseExpiresAt: b.LeaseExpiresAt, LeaseGeneration: b.LeaseGeneration,
		LeaseRenewedAt: b.LeaseRenewedAt, StartedAt: b.StartedAt, CompletedAt: b.CompletedAt,
		Parked: b.Parked(), ParkedAt: b.ParkedAt, CancelledAt: b.CancelledAt,
		SourceFolder: strings.TrimPrefix(b.Scope(), folder.ScopePrefix),
	}
	end := now
	if b.CompletedAt != nil {
		end = *b.CompletedAt
	}
	v.AgeSeconds = end.Sub(b.StartedAt).Round(time.Millisecond).Seconds()
	if b.LeaseID != nil {
		v.LeaseHolder = *b.LeaseID
	}
	if b.LeaseExpiresAt != nil {
		v.LeaseExpiresInSeconds = seconds(b.LeaseExpiresAt.Sub(now))
	}
	if b.LeaseRenewedAt != nil && b.LeaseID != nil {
		v.LeaseRenewedSecondsAgo = seconds(now.Sub(*b.LeaseRenewedAt))
	}
	if b.ParkedReason != nil {
		v.ParkedReason = *b.ParkedReason
	}
	if b.CancelledBy != nil {
		v.CancelledBy = *b.CancelledBy
	}
	if b.CancelReason != nil {
		v.CancelReason = *b.CancelReason
	}
	if b.SourceScope != nil {
		d, err := batch.ParseDetails(b.Details)
		if err != nil {
			v.DetailsError = err.Error()
		} else {
			v.Phase, v.RedshiftCommitted, v.RecordCount, v.RetryOf = string(d.Phase), d.RedshiftCommitted, d.RecordCount, d.RetryOf
			if d.LastError != nil {
				v.LastError, v.Reason = d.LastError.Message, string(d.LastError.Reason)
			}
			if o := d.Objects; o != nil {
				v.Objects = &Objects{Count: o.Count, Bytes: o.Bytes, NewestModified: o.NewestModified, Digest: o.Digest,
					Marker: o.Marker, MarkerModified: o.MarkerModified, Late: o.Late, BadRecords: o.BadRecords}
			}
			if t := d.TookOver; t != nil {
				v.TookOver = &TookOver{BatchID: t.BatchID, BatchUID: t.BatchUID, Generation: t.Generation, At: t.At}
			}
			if p := d.Progress; p != nil {
				v.ObjectsDone, v.ObjectsTotal, v.RecordsDone, v.ProgressAt = &p.ObjectsDone, &p.ObjectsTotal, &p.RecordsDone, &p.At
			}
		}
	}
	return v
}

// AddLinks fills in the River jobs of views' batches, the batches that
// retry them, and the folder's newest batch that superseded them.
func AddLinks(ctx context.Context, pool *pgxpool.Pool, views []View) error {
	ids := make([]int64, len(views))
	for i, v := range views {
		ids[i] = v.BatchID
	}
	riverJobs, err := jobs.JobsOfBatches(ctx, pool, ids)
	if err != nil {
		return fmt.Errorf("river jobs of the batches: %w", err)
	}
	retries, err := batch.NewStore(pool).RetriedBy(ctx, ids)
	if err != nil {
		return fmt.Errorf("retries of the batches: %w", err)
	}
	superseded, err := batch.NewStore(pool).SupersededBy(ctx, ids)
	if err != nil {
		return fmt.Errorf("newest batches of the folders: %w", err)
	}
	for i := range views {
		id := views[i].BatchID
		views[i].RiverJobs, views[i].RetriedBy, views[i].SupersededBy = riverJobs[id], retries[id], superseded[id]
	}
	return nil
}

// waitingStates are the states of a River job that waits to be worked.
var waitingStates = map[string]bool{"available": true, "scheduled": true, "retryable": true, "pending": true}

// AddPausedQueues sets QueuePaused on the Running views (their RiverJobs
// filled in by AddLinks) that wait in a paused queue.
func AddPausedQueues(ctx context.Context, db batch.DB, views []View) error {
	var queues []string
	seen := map[string]bool{}
	for _, v := range views {
		for _, j := range v.RiverJobs {
			if v.Status == string(batch.StatusRunning) && waitingStates[j.State] && !seen[j.Queue] {
				seen[j.Queue] = true
				queues = append(queues, j.Queue)
			}
		}
	}
	if len(queues) == 0 {
		return nil
	}
	paused, err := jobs.PausedQueues(ctx, db, queues)
	if err != nil {
		return fmt.Errorf("paused queues: %w", err)
	}
	for i, v := range views {
		for _, j := range v.RiverJobs {
			if v.Status == string(batch.StatusRunning) && waitingStates[j.State] && paused[j.Queue] {
				views[i].QueuePaused = j.Queue
				break
			}
		}
	}
	return nil
}
