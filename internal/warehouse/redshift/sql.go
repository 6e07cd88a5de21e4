package redshift

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/fleet/ingest/internal/warehouse"
)

// The SQL of the Redshift warehouse.
//
// Values are written into the statement text as literals, never sent as
// Data API parameters: the Data API documents parameters for SELECT,
// INSERT, UPDATE and DELETE only, and the warehouse's transactions also
// hold LOCK, COPY and DDL. Every string goes through quoteLiteral (the one
// quoting function), every integer through strconv; statements are
// templates whose :name placeholders render replaces with those literals.
// The COPY's manifest URL and IAM role are literals too, and come from
// configuration held to patterns without quotes or backslashes.
//
// Guards are explicit: keys are informational in Redshift. A guard is a
// SELECT that divides by zero unless its condition holds (a condition on
// scalar subqueries, which no planner folds away), which fails the
// statement and so the whole transaction; the caller then reads the stamp
// to learn why.

// errUnquotable is wrapped by quoteLiteral's refusals.
var errUnquotable = errors.New("value cannot be written as a Redshift string literal")

// quoteLiteral writes s as a Redshift string literal: between single
// quotes, with every single quote and every backslash doubled (Redshift
// reads a backslash in a literal as an escape, as its QUOTE_LITERAL
// function documents). It refuses what no literal can carry faithfully:
// NUL, and bytes that are not UTF-8.
func quoteLiteral(s string) (string, error) {
	if !utf8.ValidString(s) {
		return "", fmt.Errorf("%w: invalid UTF-8", errUnquotable)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "", fmt.Errorf("%w: NUL", errUnquotable)
	}
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'', '\\':
			b.WriteByte(c)
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String(), nil
}

// values are rendered SQL literals by placeholder name.
type values map[string]string

// sliceValues renders a slice's tenant, scope, batch (id and uid, ” for
// a legacy batch), generation and the forgotten batch it may take over
// (takeover_id -1 and takeover_uid ” when none: no batch has id -1).
func sliceValues(s warehouse.Slice) (values, error) {
	tenant, err := quoteLiteral(s.TenantID)
	if err != nil {
		return nil, fmt.Errorf("tenant id: %w", err)
	}
	scope, err := quoteLiteral(s.SourceScope)
	if err != nil {
		return nil, fmt.Errorf("source scope: %w", err)
	}
	uid, err := quoteLiteral(s.BatchUID)
	if err != nil {
		return nil, fmt.Errorf("batch uid: %w", err)
	}
	takeoverID, takeoverUID := int64(-1), "''"
	if t := s.TakeOver; t != nil {
		if takeoverUID, err = quoteLiteral(t.UID); err != nil {
			return nil, fmt.Errorf("taken-over batch uid: %w", err)
		}
		takeoverID = t.ID
	}
	return values{
		"tenant_id": tenant, "source_scope": scope,
		"batch_id": strconv.FormatInt(s.BatchID, 10), "batch_uid": uid, "generation": strconv.FormatInt(s.Generation, 10),
		"takeover_id": strconv.FormatInt(takeoverID, 10), "takeover_uid": takeoverUID,
	}, nil
}

// with returns v and an integer value more.
func (v values) with(name string, n int64) values {
	out := make(values, len(v)+1)
	for k, x := range v {
		out[k] = x
	}
	out[name] = strconv.FormatInt(n, 10)
	return out
}

// render replaces each :name of a template (outside quotes) with its
// rendered value. A placeholder without a value is a programming error.
func render(template string, v values) string {
	var out strings.Builder
	inQuote := false
	for i := 0; i < len(template); i++ {
		c := template[i]
		switch {
		case c == '\'':
			inQuote = !inQuote
			out.WriteByte(c)
		case !inQuote && c == ':' && i+1 < len(template) && template[i+1] == ':':
			out.WriteString("::")
			i++
		case !inQuote && c == ':' && i+1 < len(template) && isIdentStart(template[i+1]):
			j := i + 1
			for j < len(template) && isIdent(template[j]) {
				j++
			}
			lit, ok := v[template[i+1:j]]
			if !ok {
				panic("redshift: no value for :" + template[i+1:j])
			}
			out.WriteString(lit)
			i = j - 1
		default:
			out.WriteByte(c)
		}
	}
	return out.String()
}

func renderAll(templates []string, v values) []string {
	out := make([]string, len(templates))
	for i, t := range templates {
		out[i] = render(t, v)
	}
	return out
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdent(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// lockWriters serialises the short critical sections of the warehouse
// tables: a load's swap and a publication take it first, before reading
// anything, so no two of them interleave. A load's COPY runs before it, in
// a transaction of its own into a staging table of its own, so no writer
// ever waits on another tenant's COPY. Should two swaps still fail
// Redshift's serializable isolation check (1023) or its snapshot-isolation
// counterpart, the failure is transient and the swap is retried. The lock
// is on a table of its own, so stamp reads never wait behind a writer.
const lockWriters = `LOCK curated.fleet_writer_lock`

// stagingTable names the table a load COPYs into: schema curated_staging,
// one table per batch and lease generation, so concurrent loads never share
// one and a retried delivery never touches an older delivery's.
func stagingTable(s warehouse.Slice) string {
	return "curated_staging.fleet_load_" + strconv.FormatInt(s.BatchID, 10) + "_" + strconv.FormatInt(s.Generation, 10)
}

// ledgerStagingTable names the table a load COPYs its ledger rows into,
// beside its records' staging table.
func ledgerStagingTable(s warehouse.Slice) string {
	return stagingTable(s) + "_objects"
}

// errorsStagingTable names the table a load COPYs its load errors into,
// beside its records' staging table.
func errorsStagingTable(s warehouse.Slice) string {
	return stagingTable(s) + "_errors"
}

// copyColumns are the columns the staged NDJSON carries.
const copyColumns = `tenant_id, source_scope, batch_id, lease_generation, object_key, line_number, record`

// ledgerColumns are the columns of curated.fleet_load_objects, which the
// staged ledger NDJSON carries.
const ledgerColumns = `tenant_id, source_scope, batch_id, batch_uid, object_key, etag, size_bytes, record_count, last_modified, marker_modified`

// errorsColumns are the columns of curated.fleet_load_errors, which the
// staged errors NDJSON carries.
const errorsColumns = `tenant_id, source_scope, batch_id, batch_uid, ordinal, object_key, line_number, column_number, reason, raw_excerpt`

// copyManifest loads exactly the parts a manifest names into the columns
// of table.
func copyManifest(table, columns, manifestURL, iamRole string) string {
	role := "default"
	if iamRole != "default" {
		role = "'" + iamRole + "'"
	}
	return "COPY " + table + " (" + columns + ")\nFROM '" + manifestURL + "'\nIAM_ROLE " + role +
		"\nMANIFEST\nFORMAT AS JSON 'auto'\nGZIP"
}

// stageSQL is a load's first transaction: no shared lock, nothing shared
// written. It (re)creates the load's staging tables and COPYs the
// manifests into them: the records' (recordsURL, empty for a load with no
// records, which stages none), the ledger's (ledgerURL) and the load
// errors' (errorsURL), both always staged; however long the COPY takes, no
// other load or publication waits.
func stageSQL(s warehouse.Slice, recordsURL, ledgerURL, errorsURL, iamRole string) []string {
	var sqls []string
	if recordsURL != "" {
		table := stagingTable(s)
		sqls = append(sqls,
			`DROP TABLE IF EXISTS `+table,
			`CREATE TABLE `+table+` (LIKE curated.fleet_records INCLUDING DEFAULTS)`,
			copyManifest(table, copyColumns, recordsURL, iamRole))
	}
	ledger, errs := ledgerStagingTable(s), errorsStagingTable(s)
	return append(sqls,
		`DROP TABLE IF EXISTS `+ledger,
		`CREATE TABLE `+ledger+` (LIKE curated.fleet_load_objects)`,
		copyManifest(ledger, ledgerColumns, ledgerURL, iamRole),
		`DROP TABLE IF EXISTS `+errs,
		`CREATE TABLE `+errs+` (LIKE curated.fleet_load_errors)`,
		copyManifest(errs, errorsColumns, errorsURL, iamRole))
}

// guardNotSuperseded fails when the slice is stamped with a newer batch
// (another batch of a higher id, or of this id with another uid), or with a
// later lease generation of this batch — unless the stamp is exactly the
// forgotten batch the load takes over (warehouse.Supersedes, in SQL; a
// NULL uid is a legacy stamp, named by its id).
const guardNotSuperseded = `SELECT 1 / CASE WHEN (SELECT count(*) FROM curated.fleet_slices
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope
    AND NOT (batch_id = :takeover_id AND COALESCE(batch_uid, '') = :takeover_uid)
    AND (batch_id > :batch_id
         OR (batch_id = :batch_id AND batch_uid IS NOT NULL AND :batch_uid <> '' AND batch_uid <> :batch_uid)
         OR (batch_id = :batch_id AND (batch_uid IS NULL OR :batch_uid = '' OR batch_uid = :batch_uid)
             AND lease_generation > :generation))) = 0
  THEN 1 ELSE 0 END`

const deleteSlice = `DELETE FROM curated.fleet_records WHERE tenant_id = :tenant_id AND source_scope = :source_scope`

// insertStaged moves the staged rows of exactly this slice and batch into
// the slice, under this delivery's generation.
const insertStaged = `INSERT INTO curated.fleet_records (` + copyColumns + `)
SELECT tenant_id, source_scope, batch_id, :generation, object_key, line_number, record FROM :staging_table
WHERE tenant_id = :tenant_id AND source_scope = :source_scope AND batch_id = :batch_id`

// guardCount fails unless the slice holds exactly the records staged.
const guardCount = `SELECT 1 / CASE WHEN (SELECT count(*) FROM curated.fleet_records
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope) = :record_count
  THEN 1 ELSE 0 END`

const deleteStamp = `DELETE FROM curated.fleet_slices WHERE tenant_id = :tenant_id AND source_scope = :source_scope`

// insertStamp stamps the slice; committed_at is the warehouse clock when
// the swap runs (GETDATE(): the statement's start, after the lock was
// granted), not when the load began.
const insertStamp = `INSERT INTO curated.fleet_slices
  (tenant_id, source_scope, batch_id, batch_uid, lease_generation, record_count, committed_at, published_at)
VALUES (:tenant_id, :source_scope, :batch_id, NULLIF(:batch_uid, ''), :generation, :record_count, GETDATE(), NULL)`

const deleteLedger = `DELETE FROM curated.fleet_load_objects WHERE tenant_id = :tenant_id AND source_scope = :source_scope`

// insertLedger moves the staged ledger rows of exactly this slice and
// batch into the ledger.
const insertLedger = `INSERT INTO curated.fleet_load_objects (` + ledgerColumns + `)
SELECT ` + ledgerColumns + ` FROM :ledger_table
WHERE tenant_id = :tenant_id AND source_scope = :source_scope AND batch_id = :batch_id`

// guardLedger fails unless the slice's ledger holds exactly the rows
// staged, and their records add up to the records staged.
const guardLedger = `SELECT 1 / CASE WHEN (SELECT count(*) FROM curated.fleet_load_objects
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope) = (SELECT count(*) FROM :ledger_table)
  AND (SELECT COALESCE(SUM(record_count), 0) FROM curated.fleet_load_objects
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope) = :record_count
  THEN 1 ELSE 0 END`

const deleteErrors = `DELETE FROM curated.fleet_load_errors WHERE tenant_id = :tenant_id AND source_scope = :source_scope`

// insertErrors moves the staged load errors of exactly this slice and
// batch into the errors table.
const insertErrors = `INSERT INTO curated.fleet_load_errors (` + errorsColumns + `)
SELECT ` + errorsColumns + ` FROM :errors_table
WHERE tenant_id = :tenant_id AND source_scope = :source_scope AND batch_id = :batch_id`

// guardErrors fails unless the slice's errors are exactly the rows staged.
const guardErrors = `SELECT 1 / CASE WHEN (SELECT count(*) FROM curated.fleet_load_errors
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope) = (SELECT count(*) FROM :errors_table)
  THEN 1 ELSE 0 END`

// swapSQL is a load's second transaction, the only one under the writer
// lock: guard, replace the slice's rows with the staged ones, check the
// count, replace the stamp, replace the ledger rows and the load errors
// with the staged ones and check them, drop the staging tables. A load with no records has no
// records' staging table (staged false): it empties the slice, stamps it
// and writes its ledger (of objects without records).
func swapSQL(s warehouse.Slice, v values, records int64, staged bool) []string {
	v = v.with("record_count", records)
	sqls := []string{lockWriters, render(guardNotSuperseded, v), render(deleteSlice, v)}
	if staged {
		v["staging_table"] = stagingTable(s)
		sqls = append(sqls, render(insertStaged, v))
	}
	v["ledger_table"] = ledgerStagingTable(s)
	v["errors_table"] = errorsStagingTable(s)
	sqls = append(sqls, render(guardCount, v), render(deleteStamp, v), render(insertStamp, v),
		render(deleteLedger, v), render(insertLedger, v), render(guardLedger, v),
		render(deleteErrors, v), render(insertErrors, v), render(guardErrors, v))
	if staged {
		sqls = append(sqls, `DROP TABLE `+stagingTable(s))
	}
	return append(sqls, `DROP TABLE `+ledgerStagingTable(s), `DROP TABLE `+errorsStagingTable(s))
}

// badRecordsJoin joins a slice's stamp (s) with the number of load errors
// of the batch it is stamped with (e.bad_records, NULL for none): the
// stamp's BadRecords. An aggregate joined on the batch, not a correlated
// subquery in the select list, which Redshift does not run.
const badRecordsJoin = `LEFT JOIN (SELECT batch_id, count(*) AS bad_records FROM curated.fleet_load_errors
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope GROUP BY batch_id) e ON e.batch_id = s.batch_id`

// readLedger reads a slice's stamp and the ledger rows of the batch it is
// stamped with, in one statement (one snapshot); a stamp without rows is
// one row of NULL ledger columns.
const readLedger = `SELECT s.batch_id, s.lease_generation, s.record_count, s.committed_at, s.published_at,
       COALESCE(e.bad_records, 0), COALESCE(s.batch_uid, ''),
       o.object_key, o.etag, o.size_bytes, o.record_count, o.last_modified, o.marker_modified
FROM curated.fleet_slices s
` + badRecordsJoin + `
LEFT JOIN curated.fleet_load_objects o
  ON o.tenant_id = s.tenant_id AND o.source_scope = s.source_scope AND o.batch_id = s.batch_id
WHERE s.tenant_id = :tenant_id AND s.source_scope = :source_scope
ORDER BY o.object_key`

// readLoadErrors reads a slice's stamp and the load errors of the batch
// it is stamped with, in one statement (one snapshot); a stamp without
// errors is one row of NULL error columns.
const readLoadErrors = `SELECT s.batch_id, s.lease_generation, s.record_count, s.committed_at, s.published_at,
       COALESCE(n.bad_records, 0), COALESCE(s.batch_uid, ''),
       e.ordinal, e.object_key, e.line_number, e.column_number, e.reason, e.raw_excerpt
FROM curated.fleet_slices s
LEFT JOIN (SELECT batch_id, count(*) AS bad_records FROM curated.fleet_load_errors
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope GROUP BY batch_id) n ON n.batch_id = s.batch_id
LEFT JOIN curated.fleet_load_errors e
  ON e.tenant_id = s.tenant_id AND e.source_scope = s.source_scope AND e.batch_id = s.batch_id
WHERE s.tenant_id = :tenant_id AND s.source_scope = :source_scope
ORDER BY e.ordinal`

// readStamp reads a slice's stamp, its age in seconds on the warehouse
// clock, and its number of load errors.
const readStamp = `SELECT s.batch_id, s.lease_generation, s.record_count, s.committed_at, s.published_at,
       CAST(EXTRACT(EPOCH FROM GETDATE()) - EXTRACT(EPOCH FROM s.committed_at) AS BIGINT),
       COALESCE(e.bad_records, 0), COALESCE(s.batch_uid, '')
FROM curated.fleet_slices s
` + badRecordsJoin + `
WHERE s.tenant_id = :tenant_id AND s.source_scope = :source_scope`

// stampedWithBatch is the condition, on a row of curated.fleet_slices or
// fleet_publications, that it names the batch (:batch_id, :batch_uid):
// batch.Ref.Names in SQL.
const stampedWithBatch = `batch_id = :batch_id AND (batch_uid IS NULL OR :batch_uid = '' OR batch_uid = :batch_uid)`

// guardPublishable fails unless the slice is stamped with the batch and is
// published already or still within the window (seconds, warehouse clock).
const guardPublishable = `SELECT 1 / CASE WHEN (SELECT count(*) FROM curated.fleet_slices
  WHERE tenant_id = :tenant_id AND source_scope = :source_scope AND ` + stampedWithBatch + `
    AND (published_at IS NOT NULL
         OR EXTRACT(EPOCH FROM GETDATE()) - EXTRACT(EPOCH FROM committed_at) <= :window_seconds)) = 1
  THEN 1 ELSE 0 END`

const markPublished = `UPDATE curated.fleet_slices SET published_at = GETDATE()
WHERE tenant_id = :tenant_id AND source_scope = :source_scope AND ` + stampedWithBatch + ` AND published_at IS NULL`

// appendPublication adds the outbox row once per batch identity: a
// publication of a forgotten batch that was handed the same id (another
// uid) does not stand for this batch's; a legacy row (no uid) names the
// batch of its id.
const appendPublication = `INSERT INTO curated.fleet_publications (tenant_id, source_scope, batch_id, batch_uid, record_count, published_at)
SELECT s.tenant_id, s.source_scope, s.batch_id, s.batch_uid, s.record_count, s.published_at FROM curated.fleet_slices s
WHERE s.tenant_id = :tenant_id AND s.source_scope = :source_scope AND s.batch_id = :batch_id
  AND (s.batch_uid IS NULL OR :batch_uid = '' OR s.batch_uid = :batch_uid)
  AND NOT EXISTS (SELECT 1 FROM curated.fleet_publications p
                  WHERE p.tenant_id = s.tenant_id AND p.source_scope = s.source_scope AND p.batch_id = s.batch_id
                    AND (p.batch_uid IS NULL OR s.batch_uid IS NULL OR p.batch_uid = s.batch_uid))`

// maxBatchID is the largest batch id the stamps and publications name
// and, with :every_table 1, the ledger and load errors too.
const maxBatchID = `SELECT GREATEST(
  COALESCE((SELECT MAX(batch_id) FROM curated.fleet_slices), 0),
  COALESCE((SELECT MAX(batch_id) FROM curated.fleet_publications), 0),
  CASE WHEN :every_table = 1 THEN COALESCE((SELECT MAX(batch_id) FROM curated.fleet_load_objects), 0) ELSE 0 END,
  CASE WHEN :every_table = 1 THEN COALESCE((SELECT MAX(batch_id) FROM curated.fleet_load_errors), 0) ELSE 0 END)`

// publishSQL is one publication's transaction.
func publishSQL(v values, windowSeconds int64) []string {
	return renderAll([]string{lockWriters, guardPublishable, markPublished, appendPublication}, v.with("window_seconds", windowSeconds))
}

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
func migrationSQL(version int64, name string, statements []string) ([]string, error) {
	n, err := quoteLiteral(name)
	if err != nil {
		return nil, fmt.Errorf("migration name: %w", err)
	}
	v := values{"version": strconv.FormatInt(version, 10), "name": n}
	sqls := []string{
		`LOCK ` + migrationsTable,
		render(`SELECT 1 / CASE WHEN (SELECT count(*) FROM `+migrationsTable+` WHERE version = :version) = 0 THEN 1 ELSE 0 END`, v),
	}
	sqls = append(sqls, statements...)
	return append(sqls, render(`INSERT INTO `+migrationsTable+` (version, name) VALUES (:version, :name)`, v)), nil
}
