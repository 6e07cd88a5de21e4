package redshift

// The SQL of the Redshift warehouse. Values travel as Data API parameters
// (:name). The only values written into statement text are the COPY's
// manifest URL and IAM role: COPY takes no bind parameters, so both are
// held to strict patterns when the configuration is validated (see
// ParseStaging and Config.Validate) and contain no quote or backslash.
//
// Guards are explicit: keys are informational in Redshift. A guard is a
// SELECT that divides by zero unless its condition holds (a condition on
// scalar subqueries, which no planner folds away), which fails the
// statement and so the whole transaction; the caller then reads the stamp
// to learn why.

// lockWriters serialises every writer of the warehouse tables: loads and
// publications all take it first, before reading anything, so no two of
// them interleave, and none fails Redshift's serializable isolation check
// against another (should one still do, the failure is transient). The
// lock is on a table of its own, so stamp reads never wait behind a COPY.
const lockWriters = `LOCK curated.fleet_writer_lock`

// guardNotSuperseded fails when the slice is stamped with a newer batch, or
// with a later lease generation of this batch.
const guardNotSuperseded = `SELECT 1 / CASE WHEN (SELECT count(*) FROM curated.fleet_slices
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope
    AND (batch_id > CAST(:batch_id AS BIGINT)
         OR (batch_id = CAST(:batch_id AS BIGINT) AND lease_generation > CAST(:generation AS BIGINT)))) = 0
  THEN 1 ELSE 0 END`

const deleteSlice = `DELETE FROM curated.fleet_records WHERE tenant_id = :tenant_id AND source_scope = :source_scope`

// guardCount fails unless the slice holds exactly the records staged.
const guardCount = `SELECT 1 / CASE WHEN (SELECT count(*) FROM curated.fleet_records
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope) = CAST(:record_count AS BIGINT)
  THEN 1 ELSE 0 END`

const deleteStamp = `DELETE FROM curated.fleet_slices WHERE tenant_id = :tenant_id AND source_scope = :source_scope`

const insertStamp = `INSERT INTO curated.fleet_slices
  (tenant_id, source_scope, batch_id, lease_generation, record_count, committed_at, published_at)
VALUES (:tenant_id, :source_scope, CAST(:batch_id AS BIGINT), CAST(:generation AS BIGINT), CAST(:record_count AS BIGINT), SYSDATE, NULL)`

// copyColumns are the columns the staged NDJSON carries.
const copyColumns = `tenant_id, source_scope, batch_id, lease_generation, object_key, line_number, record`

// copyManifest loads exactly the parts a manifest names.
func copyManifest(manifestURL, iamRole string) string {
	role := "default"
	if iamRole != "default" {
		role = "'" + iamRole + "'"
	}
	return "COPY curated.fleet_records (" + copyColumns + ")\nFROM '" + manifestURL + "'\nIAM_ROLE " + role +
		"\nMANIFEST\nFORMAT AS JSON 'auto'\nGZIP"
}

// loadSQL is one load's transaction.
func loadSQL(manifestURL, iamRole string) []string {
	sqls := []string{lockWriters, guardNotSuperseded, deleteSlice}
	if manifestURL != "" {
		sqls = append(sqls, copyManifest(manifestURL, iamRole))
	}
	return append(sqls, guardCount, deleteStamp, insertStamp)
}

// readStamp reads a slice's stamp and its age on the warehouse clock.
const readStamp = `SELECT batch_id, lease_generation, record_count, committed_at, published_at,
       CAST(EXTRACT(EPOCH FROM SYSDATE) - EXTRACT(EPOCH FROM committed_at) AS BIGINT)
FROM curated.fleet_slices WHERE tenant_id = :tenant_id AND source_scope = :source_scope`

// guardPublishable fails unless the slice is stamped with the batch and is
// published already or still within the window (seconds, warehouse clock).
const guardPublishable = `SELECT 1 / CASE WHEN (SELECT count(*) FROM curated.fleet_slices
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope AND batch_id = CAST(:batch_id AS BIGINT)
    AND (published_at IS NOT NULL
         OR EXTRACT(EPOCH FROM SYSDATE) - EXTRACT(EPOCH FROM committed_at) <= CAST(:window_seconds AS BIGINT))) = 1
  THEN 1 ELSE 0 END`

const markPublished = `UPDATE curated.fleet_slices SET published_at = SYSDATE
WHERE tenant_id = :tenant_id AND source_scope = :source_scope AND batch_id = CAST(:batch_id AS BIGINT) AND published_at IS NULL`

// appendPublication adds the outbox row once per batch.
const appendPublication = `INSERT INTO curated.fleet_publications (tenant_id, source_scope, batch_id, record_count, published_at)
SELECT s.tenant_id, s.source_scope, s.batch_id, s.record_count, s.published_at FROM curated.fleet_slices s
WHERE s.tenant_id = :tenant_id AND s.source_scope = :source_scope AND s.batch_id = CAST(:batch_id AS BIGINT)
  AND NOT EXISTS (SELECT 1 FROM curated.fleet_publications p
                  WHERE p.tenant_id = s.tenant_id AND p.source_scope = s.source_scope AND p.batch_id = s.batch_id)`

// publishSQL is one publication's transaction.
var publishSQL = []string{lockWriters, guardPublishable, markPublished, appendPublication}

// Migrations.

const migrationsTable = "curated.fleet_warehouse_migrations"

var bootstrapSQL = []string{
	`CREATE SCHEMA IF NOT EXISTS curated`,
	`CREATE TABLE IF NOT EXISTS ` + migrationsTable + ` (
    version    BIGINT       NOT NULL,
    name       VARCHAR(256) NOT NULL,
    applied_at TIMESTAMP    NOT NULL DEFAULT SYSDATE
)
DISTSTYLE ALL`,
}

const appliedMigrations = `SELECT version FROM ` + migrationsTable + ` ORDER BY version`

// migrationSQL wraps one migration's statements: it fails when the version
// was applied meanwhile (by a concurrent migrate), and records it.
func migrationSQL(statements []string) []string {
	sqls := []string{
		`LOCK ` + migrationsTable,
		`SELECT 1 / CASE WHEN (SELECT count(*) FROM ` + migrationsTable + ` WHERE version = CAST(:version AS BIGINT)) = 0 THEN 1 ELSE 0 END`,
	}
	sqls = append(sqls, statements...)
	return append(sqls, `INSERT INTO `+migrationsTable+` (version, name) VALUES (CAST(:version AS BIGINT), :name)`)
}
