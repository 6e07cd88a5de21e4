package batch

import "context"

// RetriedBy returns, for each of the batches ids, the batches that retry it
// (enqueue retry records the retried batch in the new batch's details as
// retryOf), oldest first. A retry is a batch of the same tenant and source
// scope, so the look-up walks ix_ingestion_batches_scope, not the table.
// Batches without a retry are absent from the map.
func (s *Store) RetriedBy(ctx context.Context, ids []int64) (map[int64][]int64, error) {
	rows, err := s.db.Query(ctx, `
		SELECT o.id, n.id
		FROM ingestion_batches o
		CROSS JOIN LATERAL (
			SELECT r.id FROM ingestion_batches r
			WHERE r.tenant_id = o.tenant_id AND r.source_scope = o.source_scope
			  AND r.id > o.id AND r.details->>'retryOf' = o.id::text
		) n
		WHERE o.id = ANY($1::bigint[]) AND o.source_scope IS NOT NULL
		ORDER BY o.id, n.id`, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64][]int64{}
	for rows.Next() {
		var of, by int64
		if err := rows.Scan(&of, &by); err != nil {
			return nil, err
		}
		out[of] = append(out[of], by)
	}
	return out, rows.Err()
}

// SupersededBy returns, for each of the batches ids that is not the newest
// batch of its folder (tenant and source scope), the newest one: the id of
// the folder's batch reserved last (the highest id, as Latest), which
// superseded it. One probe of ix_ingestion_batches_scope per batch.
func (s *Store) SupersededBy(ctx context.Context, ids []int64) (map[int64]int64, error) {
	rows, err := s.db.Query(ctx, `
		SELECT o.id, n.id
		FROM ingestion_batches o
		CROSS JOIN LATERAL (
			SELECT r.id FROM ingestion_batches r
			WHERE r.tenant_id = o.tenant_id AND r.source_scope = o.source_scope
			ORDER BY r.id DESC LIMIT 1
		) n
		WHERE o.id = ANY($1::bigint[]) AND o.source_scope IS NOT NULL AND n.id > o.id`, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64]int64{}
	for rows.Next() {
		var of, by int64
		if err := rows.Scan(&of, &by); err != nil {
			return nil, err
		}
		out[of] = by
	}
	return out, rows.Err()
}
