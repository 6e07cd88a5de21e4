package batch

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Knows reports whether the operational database knows the batch r names
// as a batch of tenantID's sourceScope: a row of that id, tenant and scope
// whose uid is r's (or either is a legacy name, see Ref.Names). A
// warehouse stamp of a batch it does not know was written by a batch the
// database forgot (a restore from a backup, a failover to a standby that
// was behind): such a stamp is no newer batch's claim on the slice, and a
// new batch of the folder takes the slice over (package fleet). One
// primary-key read.
func (s *Store) Knows(ctx context.Context, r Ref, tenantID, sourceScope string) (bool, error) {
	var uid, tenant, scope string
	err := s.db.QueryRow(ctx, `
		SELECT COALESCE(batch_uid::text, ''), tenant_id, COALESCE(source_scope, '')
		FROM ingestion_batches WHERE id = $1`, r.ID).Scan(&uid, &tenant, &scope)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("looking up batch %s: %w", r, err)
	}
	return r.Names(Ref{ID: r.ID, UID: uid}) && tenant == tenantID && scope == sourceScope, nil
}

// AdvanceIDs moves the batches' id sequence past id, so that no batch is
// handed an id the warehouse still names (see migration 00100,
// ingest_advance_batch_ids): worker migrate and worker run pass the
// largest batch id the warehouse names, and a load that met a forgotten
// batch's stamp passes its id. It returns the sequence's last value
// afterwards; a sequence already past id is left alone.
func (s *Store) AdvanceIDs(ctx context.Context, id int64) (last int64, err error) {
	if err := s.db.QueryRow(ctx, `SELECT ingest_advance_batch_ids($1)`, id).Scan(&last); err != nil {
		return 0, fmt.Errorf("advancing the batch id sequence past %d: %w", id, err)
	}
	return last, nil
}
