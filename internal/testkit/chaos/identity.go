package chaos

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// identityColumns are the columns of batch identity (issue 43): the batch
// row's uid and the uid the warehouse stamps beside each batch id it
// names. CheckIdentity needs them all.
var identityColumns = []struct{ schema, table string }{
	{"public", "ingestion_batches"},
	{"curated", "fleet_slices"},
	{"curated", "fleet_publications"},
	{"curated", "fleet_load_objects"},
	{"curated", "fleet_load_errors"},
}

// warehouseIdentities lists every (batch id, batch uid) the warehouse
// names, with where.
const warehouseIdentities = `
	SELECT batch_id, batch_uid, 'fleet_slices' FROM curated.fleet_slices
	UNION SELECT batch_id, batch_uid, 'fleet_publications' FROM curated.fleet_publications
	UNION SELECT batch_id, batch_uid, 'fleet_load_objects' FROM curated.fleet_load_objects
	UNION SELECT batch_id, batch_uid, 'fleet_load_errors' FROM curated.fleet_load_errors`

// IdentityReport is CheckIdentity's verdict.
type IdentityReport struct {
	// Skipped says why nothing was checked (the identity columns are
	// missing: a build before batch identity); empty when checked.
	Skipped string
	// Forgotten counts the batch uids the warehouse names that the
	// operational database does not know (batches the rewind forgot):
	// information, not a violation.
	Forgotten int
	// Reused counts the batch ids the warehouse names with two or more
	// uids (ids handed out again after the rewind, before anything moved
	// the sequence past them): a violation only when the caller asked
	// that ids never repeat (CheckIdentity's idsNeverRepeat), information
	// otherwise: the uid keeps the two batches apart.
	Reused     int
	Violations []string
}

func (r *IdentityReport) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// CheckIdentity verifies what a batch's identity must guarantee once the
// operational database went back in time while the warehouse did not (a
// restore, a failover to a standby that was behind), reading the
// operational database through pool and the warehouse through warehouse:
//
//   - every good folder's slice is stamped with the uid of the folder's
//     newest batch, as well as its id, and that batch's publication names
//     it by its uid (a stamp naming the newest batch's id with another
//     batch's uid is a slice that batch did not load);
//   - the warehouse never names two batches by one identity: one uid with
//     two ids; and, with idsNeverRepeat (after worker migrate moved the
//     sequence past the warehouse's ids), one batch id with two uids (an
//     id handed out again after the rewind). Without it such ids are
//     counted (Reused), not violations: after a failover that no step
//     followed the sequence may hand out ids the warehouse names until a
//     load takes a forgotten stamp over, and the uid keeps the batches
//     apart;
//   - no two batches of the operational database share a uid.
//
// It checks nothing, and says so in Skipped, when the columns of batch
// identity do not exist.
func CheckIdentity(ctx context.Context, pool, warehouse *pgxpool.Pool, expect []Expectation, idsNeverRepeat bool) (IdentityReport, error) {
	var r IdentityReport
	for _, c := range identityColumns {
		db := warehouse
		if c.schema == "public" {
			db = pool
		}
		var present bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
			WHERE table_schema = $1 AND table_name = $2 AND column_name = 'batch_uid')`, c.schema, c.table).Scan(&present); err != nil {
			return r, err
		}
		if !present {
			r.Skipped = fmt.Sprintf("%s.%s has no batch_uid column: batch identity is not in this build", c.schema, c.table)
			return r, nil
		}
	}

	known := map[string]int64{} // uid → id, in the operational database
	rows, err := pool.Query(ctx, `SELECT id, batch_uid::text FROM ingestion_batches WHERE source_scope IS NOT NULL AND batch_uid IS NOT NULL`)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var id int64
		var uid string
		if err := rows.Scan(&id, &uid); err != nil {
			return r, err
		}
		if other, dup := known[uid]; dup {
			r.violate("batches %d and %d share the uid %s", other, id, uid)
		}
		known[uid] = id
	}
	if err := rows.Err(); err != nil {
		return r, err
	}

	uidsOf := map[int64]map[string]string{} // id → uid → a table naming it
	idsOf := map[string]map[int64]bool{}
	rows, err = warehouse.Query(ctx, warehouseIdentities)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var id int64
		var uid *string
		var table string
		if err := rows.Scan(&id, &uid, &table); err != nil {
			return r, err
		}
		if uid == nil {
			r.violate("%s names batch %d without its uid", table, id)
			continue
		}
		if uidsOf[id] == nil {
			uidsOf[id] = map[string]string{}
		}
		uidsOf[id][*uid] = table
		if idsOf[*uid] == nil {
			idsOf[*uid] = map[int64]bool{}
		}
		idsOf[*uid][id] = true
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	for id, uids := range uidsOf {
		if len(uids) > 1 {
			r.Reused++
			if idsNeverRepeat {
				r.violate("the warehouse names batch id %d with %d uids (%v): an id handed out again after the rewind", id, len(uids), uids)
			}
		}
	}
	for uid, ids := range idsOf {
		if len(ids) > 1 {
			r.violate("the warehouse names uid %s with %d batch ids", uid, len(ids))
		}
		if _, ok := known[uid]; !ok {
			r.Forgotten++
		}
	}

	for _, e := range expect {
		if e.Bad {
			continue
		}
		var newestID int64
		var newestUID string
		err := pool.QueryRow(ctx, `SELECT id, COALESCE(batch_uid::text, '') FROM ingestion_batches WHERE tenant_id = $1 AND source_scope = $2 ORDER BY id DESC LIMIT 1`,
			e.TenantID, e.Scope).Scan(&newestID, &newestUID)
		if err != nil {
			continue // Check reports a folder without a batch
		}
		var stampID *int64
		var stampUID *string
		var published int
		if err := warehouse.QueryRow(ctx, `
			SELECT (SELECT batch_id FROM curated.fleet_slices WHERE tenant_id = $1 AND source_scope = $2),
			       (SELECT batch_uid FROM curated.fleet_slices WHERE tenant_id = $1 AND source_scope = $2),
			       (SELECT count(*) FROM curated.fleet_publications WHERE tenant_id = $1 AND source_scope = $2 AND batch_uid = $3)`,
			e.TenantID, e.Scope, newestUID).Scan(&stampID, &stampUID, &published); err != nil {
			return r, err
		}
		switch {
		case stampUID == nil:
			r.violate("folder %s of %s: slice stamped with %v and no uid, not with its newest batch %d (%s)", e.Scope, e.TenantID, deref(stampID), newestID, newestUID)
		case *stampUID != newestUID:
			r.violate("folder %s of %s: slice stamped with batch %v uid %s, not with its newest batch %d uid %s", e.Scope, e.TenantID, deref(stampID), *stampUID, newestID, newestUID)
		}
		if published != 1 {
			r.violate("folder %s of %s: its newest batch %d (%s) is published %d times under its uid, want once", e.Scope, e.TenantID, newestID, newestUID, published)
		}
	}
	return r, nil
}
