package jobs

import (
	"context"

	"github.com/fleet/ingest/internal/batch"
)

// JobRef names one River job of a batch: what the River UI shows under
// that id, and what an operator acts on.
type JobRef struct {
	JobID   int64  `json:"job_id"`
	State   string `json:"state"`
	Attempt int    `json:"attempt"`
	// Queue is the River queue the job is in (Queue; a paused queue's
	// jobs wait: PausedQueues).
	Queue string `json:"queue"`
}

// PausedQueues returns which of queues are paused (river_queue.paused_at
// set: the River UI's Pause, or River's QueuePause). A queue River has no
// row for is not.
func PausedQueues(ctx context.Context, db batch.DB, queues []string) (map[string]bool, error) {
	rows, err := db.Query(ctx, `SELECT name FROM river_queue WHERE name = ANY($1) AND paused_at IS NOT NULL`, queues)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		out[name] = true
	}
	return out, rows.Err()
}

// JobsOfBatches returns the River jobs (kind fleet_ingest) still in
// river_job for each of the batches ids, oldest first: the enqueue's job,
// resumes', and the sweeper's redeliveries. River deletes finalized jobs
// after its retention periods (a day for completed jobs by default), so an
// older batch may have none. Each look-up uses River's GIN index on args.
func JobsOfBatches(ctx context.Context, db batch.DB, ids []int64) (map[int64][]JobRef, error) {
	rows, err := db.Query(ctx, `
		SELECT b.id, j.id, j.state::text, j.attempt, j.queue
		FROM unnest($1::bigint[]) AS b(id)
		CROSS JOIN LATERAL (
			SELECT id, state, attempt, queue FROM river_job
			WHERE kind = $2 AND args @> jsonb_build_object('batch_id', b.id)
		) j
		ORDER BY b.id, j.id`, ids, IngestArgs{}.Kind())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64][]JobRef{}
	for rows.Next() {
		var id int64
		var j JobRef
		if err := rows.Scan(&id, &j.JobID, &j.State, &j.Attempt, &j.Queue); err != nil {
			return nil, err
		}
		out[id] = append(out[id], j)
	}
	return out, rows.Err()
}
