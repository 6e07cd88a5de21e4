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
}

// JobsOfBatches returns the River jobs (kind fleet_ingest) still in
// river_job for each of the batches ids, oldest first: the enqueue's job,
// resumes', and the sweeper's redeliveries. River deletes finalized jobs
// after its retention periods (a day for completed jobs by default), so an
// older batch may have none. Each look-up uses River's GIN index on args.
func JobsOfBatches(ctx context.Context, db batch.DB, ids []int64) (map[int64][]JobRef, error) {
	rows, err := db.Query(ctx, `
		SELECT b.id, j.id, j.state::text, j.attempt
		FROM unnest($1::bigint[]) AS b(id)
		CROSS JOIN LATERAL (
			SELECT id, state, attempt FROM river_job
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
		if err := rows.Scan(&id, &j.JobID, &j.State, &j.Attempt); err != nil {
			return nil, err
		}
		out[id] = append(out[id], j)
	}
	return out, rows.Err()
}
