// Package grants checks, when a process starts, that its database login
// holds what deploy/postgres/roles.sql grants the role the process acts as
// (fleet_worker, fleet_enqueue, fleet_reconcile, fleet_operator), and names
// what is missing.
//
// roles.sql is run by hand, after worker migrate: an upgrade whose
// migrations add a table, a column a role writes or a function, or recreate
// River's tables, needs it run again. Forgotten, the new code meets
// "permission denied" (SQLSTATE 42501) at the first statement that needs
// the new grant, perhaps hours later and in the middle of a batch. Checked
// at start, the process refuses to start instead (cli.RequireGrants: exit
// cli.ExitMissingGrants) and its log names every privilege missing and the
// remedy: re-run deploy/postgres/roles.sql.
//
// A login that is a superuser or owns the tables (development, the
// migrating role) holds every privilege and passes. The privileges listed
// here are those roles.sql grants and the code uses; a test runs roles.sql
// and requires every role to pass, so the list cannot ask for a grant
// roles.sql does not make. Row-level security is checked too: a login
// subject to it needs a policy of ingestion_batches for each command it
// runs there.
package grants

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Role is a group role of deploy/postgres/roles.sql.
type Role string

// The runtime roles of deploy/postgres/roles.sql.
const (
	Worker  Role = "fleet_worker"  // worker run
	Enqueue Role = "fleet_enqueue" // the doors: enqueue import, serve, sqs
	// Reconcile is enqueue reconcile's role: the doors' reservations and
	// job inserts, and the only one that writes reconcile's checkpoints
	// (so a checkpoint another login moved is told apart by its mover).
	Reconcile Role = "fleet_reconcile"
	Operator  Role = "fleet_operator" // enqueue cancel, retry, resume, prune; serve's operator surfaces
)

// Kinds of Privilege.
const (
	KindTable    = "table"
	KindColumn   = "column"
	KindSequence = "sequence"
	KindFunction = "function"
	KindSchema   = "schema"
	KindPolicy   = "policy" // a row-level security policy letting the login run Mode on Object
)

// Privilege is one privilege a role needs.
type Privilege struct {
	Kind   string // KindTable, KindColumn, …
	Object string // schema-qualified: public.ingestion_batches, public.ingest_prune_signatures()
	Column string // for KindColumn
	Mode   string // SELECT, INSERT, UPDATE, DELETE, USAGE, EXECUTE (for KindPolicy, the command)
}

// String writes p as GRANT would name it (objects of schema public
// unqualified): UPDATE (parked_at) ON ingestion_batches.
func (p Privilege) String() string {
	obj := strings.TrimPrefix(p.Object, "public.")
	switch p.Kind {
	case KindColumn:
		return fmt.Sprintf("%s (%s) ON %s", p.Mode, p.Column, obj)
	case KindSequence:
		return fmt.Sprintf("%s ON SEQUENCE %s", p.Mode, obj)
	case KindFunction:
		return fmt.Sprintf("%s ON FUNCTION %s", p.Mode, obj)
	case KindSchema:
		return fmt.Sprintf("%s ON SCHEMA %s", p.Mode, obj)
	case KindPolicy:
		return fmt.Sprintf("a row-level security policy FOR %s ON %s", p.Mode, obj)
	default:
		return fmt.Sprintf("%s ON %s", p.Mode, obj)
	}
}

// Querier is what the check needs of a pool or a connection.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const batches = "public.ingestion_batches"

func table(obj string, modes ...string) []Privilege {
	out := make([]Privilege, 0, len(modes))
	for _, m := range modes {
		out = append(out, Privilege{Kind: KindTable, Object: obj, Mode: m})
	}
	return out
}

func columns(obj, mode string, cols ...string) []Privilege {
	out := make([]Privilege, 0, len(cols))
	for _, c := range cols {
		out = append(out, Privilege{Kind: KindColumn, Object: obj, Column: c, Mode: mode})
	}
	return out
}

func policy(cmd string) Privilege { return Privilege{Kind: KindPolicy, Object: batches, Mode: cmd} }

// reserveColumns are the columns a reservation writes (roles.sql's
// "Reservations" section).
var reserveColumns = []string{"company_id", "tenant_id", "tenant_database", "ingestion_mode", "source_type",
	"business_date", "pipeline_stage", "status", "details", "source_scope", "completed_at"}

// reserve is what a door needs to reserve batches and insert their River
// jobs (roles.sql's "Reservations" and "fleet_enqueue" sections), shared by
// fleet_enqueue and fleet_reconcile.
func reserve() []Privilege {
	var p []Privilege
	p = append(p, columns(batches, "INSERT", reserveColumns...)...)
	p = append(p, policy("INSERT"))
	p = append(p, Privilege{Kind: KindSequence, Object: "public.ingestion_batches_id_seq", Mode: "USAGE"})
	p = append(p, table("public.ingest_schema_migrations", "SELECT")...)
	p = append(p, table("public.river_job", "SELECT", "INSERT")...)
	p = append(p, columns("public.river_job", "UPDATE", "kind")...)
	p = append(p, Privilege{Kind: KindSequence, Object: "public.river_job_id_seq", Mode: "USAGE"})
	p = append(p, table("public.river_migration", "SELECT")...)
	return p
}

// Required returns the privileges role needs whatever the database holds;
// Missing adds those on the objects it finds (River's tables and
// sequences, the local warehouse schema).
func Required(role Role) []Privilege {
	var p []Privilege
	p = append(p, table(batches, "SELECT")...)
	p = append(p, policy("SELECT"))
	switch role {
	case Worker:
		p = append(p, columns(batches, "UPDATE", "status", "details", "completed_at", "updated_at",
			"execution_lease_id", "execution_lease_expires_at", "execution_lease_generation",
			"execution_lease_renewed_at", "execution_lease_terms", "parked_at", "parked_reason")...)
		p = append(p, policy("UPDATE"))
		p = append(p, table("public.ingest_schema_migrations", "SELECT")...)
		p = append(p, table("public.ingest_sweeps", "SELECT", "INSERT", "UPDATE")...)
		p = append(p, Privilege{Kind: KindFunction, Object: "public.ingest_advance_batch_ids(bigint)", Mode: "EXECUTE"})
	case Enqueue:
		p = append(p, reserve()...)
		// A tenant's cancel of its own batch no delivery holds (the
		// public cancel route): an operator cancel's columns, under a
		// policy of the door's own.
		p = append(p, columns(batches, "UPDATE", "status", "details", "completed_at", "updated_at",
			"execution_lease_id", "execution_lease_expires_at", "execution_lease_generation",
			"execution_lease_terms", "cancelled_at", "cancelled_by", "cancel_reason")...)
		p = append(p, policy("UPDATE"))
		p = append(p, columns("public.ingest_seen_signatures", "SELECT", "digest", "expires_at")...)
		for _, f := range []string{"ingest_claim_signature(bytea, interval)", "ingest_release_signature(bytea, bytea)", "ingest_prune_signatures()"} {
			p = append(p, Privilege{Kind: KindFunction, Object: "public." + f, Mode: "EXECUTE"})
		}
	case Reconcile:
		p = append(p, reserve()...)
		p = append(p, table("public.ingest_reconcile_checkpoints", "SELECT", "INSERT", "UPDATE")...)
	case Operator:
		p = append(p, columns(batches, "INSERT", reserveColumns...)...)
		p = append(p, policy("INSERT"))
		p = append(p, Privilege{Kind: KindSequence, Object: "public.ingestion_batches_id_seq", Mode: "USAGE"})
		p = append(p, columns(batches, "UPDATE", "status", "details", "completed_at", "updated_at",
			"execution_lease_id", "execution_lease_expires_at", "execution_lease_generation",
			"execution_lease_terms", "cancelled_at", "cancelled_by", "cancel_reason")...)
		p = append(p, policy("UPDATE"))
		p = append(p, table(batches, "DELETE")...)
		p = append(p, policy("DELETE"))
		p = append(p, table("public.river_job", "INSERT", "UPDATE", "DELETE")...)
		p = append(p, table("public.river_queue", "UPDATE")...)
		p = append(p, Privilege{Kind: KindSequence, Object: "public.river_job_id_seq", Mode: "USAGE"})
		// The operators' audit (migration 110): every action writes a
		// row, enqueue audit reads them.
		p = append(p, table("public.ingest_operator_actions", "SELECT")...)
		p = append(p, columns("public.ingest_operator_actions", "INSERT",
			"actor", "door", "action", "outcome", "batch_id", "tenant_id", "queue", "reason", "note", "details")...)
	}
	return p
}

// found returns the privileges role needs on the objects of this database
// that roles.sql grants by what it finds: every River table and sequence,
// and the local warehouse schema (curated) when it is in this database.
func found(ctx context.Context, q Querier, role Role) ([]Privilege, error) {
	rows, err := q.Query(ctx, `
		SELECT 'table', format('%I.%I', schemaname, tablename) FROM pg_tables
		 WHERE schemaname = 'public' AND tablename LIKE 'river%'
		UNION ALL
		SELECT 'sequence', format('%I.%I', schemaname, sequencename) FROM pg_sequences
		 WHERE schemaname = 'public' AND sequencename LIKE 'river%'
		UNION ALL
		SELECT 'curated', format('%I.%I', schemaname, tablename) FROM pg_tables
		 WHERE schemaname = 'curated'
		   AND tablename IN ('fleet_records', 'fleet_slices', 'fleet_publications', 'fleet_load_objects', 'fleet_load_errors')
		ORDER BY 1, 2`)
	if err != nil {
		return nil, err
	}
	var p []Privilege
	curated := false
	for rows.Next() {
		var kind, obj string
		if err := rows.Scan(&kind, &obj); err != nil {
			rows.Close()
			return nil, err
		}
		switch {
		case kind == "table" && role == Worker:
			p = append(p, table(obj, "SELECT", "INSERT", "UPDATE", "DELETE")...)
		case kind == "table" && role == Operator:
			p = append(p, table(obj, "SELECT")...)
		case kind == "sequence" && role == Worker:
			p = append(p, Privilege{Kind: KindSequence, Object: obj, Mode: "USAGE"})
		case kind == "curated":
			if !curated && role != Enqueue && role != Reconcile {
				p = append(p, Privilege{Kind: KindSchema, Object: "curated", Mode: "USAGE"})
				curated = true
			}
			p = append(p, curatedTable(role, obj)...)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if curated && role == Worker {
		p = append(p, Privilege{Kind: KindSequence, Object: "curated.fleet_publications_id_seq", Mode: "USAGE"})
	}
	return p, nil
}

// curatedTable is roles.sql's "Local warehouse" section.
func curatedTable(role Role, obj string) []Privilege {
	switch role {
	case Worker:
		switch obj {
		case "curated.fleet_slices":
			return table(obj, "SELECT", "INSERT", "UPDATE")
		case "curated.fleet_publications":
			return table(obj, "SELECT", "INSERT")
		default: // fleet_records, fleet_load_objects, fleet_load_errors
			return table(obj, "SELECT", "INSERT", "DELETE")
		}
	case Operator:
		if obj == "curated.fleet_slices" || obj == "curated.fleet_load_objects" || obj == "curated.fleet_load_errors" {
			return table(obj, "SELECT")
		}
	}
	return nil
}

// checkSQL answers, for each privilege (kind, object, column, mode), whether
// the current login holds it; an object that does not exist, or in a schema
// the login may not use (whose objects PostgreSQL will not even look up for
// it), is not held.
// A policy is held when row-level security does not apply to the login
// (not enabled on the table, or the login is a superuser, may bypass it or
// is a member of the table's owner) or a policy of the table for that
// command (or ALL) names PUBLIC or a role the login is a member of.
const checkSQL = `
SELECT p.i
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS p(kind, obj, col, mode, i)
 WHERE NOT CASE
	WHEN p.kind <> 'schema' AND to_regnamespace(split_part(p.obj, '.', 1)) IS NULL THEN false
	WHEN p.kind <> 'schema' AND NOT has_schema_privilege(split_part(p.obj, '.', 1), 'USAGE') THEN false
	WHEN p.kind IN ('table', 'column', 'sequence', 'policy') AND to_regclass(p.obj) IS NULL THEN false
	WHEN p.kind = 'function' AND to_regprocedure(p.obj) IS NULL THEN false
	WHEN p.kind = 'schema' AND to_regnamespace(p.obj) IS NULL THEN false
	WHEN p.kind = 'column' AND NOT EXISTS (
		SELECT FROM pg_attribute a WHERE a.attrelid = to_regclass(p.obj) AND a.attname = p.col AND NOT a.attisdropped) THEN false
	WHEN p.kind = 'table' THEN has_table_privilege(p.obj, p.mode)
	WHEN p.kind = 'column' THEN has_column_privilege(p.obj, p.col, p.mode)
	WHEN p.kind = 'sequence' THEN has_sequence_privilege(p.obj, p.mode)
	WHEN p.kind = 'function' THEN has_function_privilege(p.obj, p.mode)
	WHEN p.kind = 'schema' THEN has_schema_privilege(p.obj, p.mode)
	WHEN p.kind = 'policy' THEN
		NOT (SELECT c.relrowsecurity FROM pg_class c WHERE c.oid = to_regclass(p.obj))
		OR (SELECT r.rolsuper OR r.rolbypassrls FROM pg_roles r WHERE r.rolname = current_user)
		OR pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = to_regclass(p.obj)), 'MEMBER')
		OR EXISTS (
			SELECT FROM pg_policy pol
			 WHERE pol.polrelid = to_regclass(p.obj)
			   AND pol.polcmd::text IN ('*', CASE p.mode WHEN 'SELECT' THEN 'r' WHEN 'INSERT' THEN 'a' WHEN 'UPDATE' THEN 'w' WHEN 'DELETE' THEN 'd' END)
			   AND (0 = ANY (pol.polroles) OR EXISTS (
					SELECT FROM unnest(pol.polroles) AS r(role_oid) WHERE pg_has_role(current_user, r.role_oid, 'MEMBER'))))
	ELSE false
 END
 ORDER BY p.i`

// Missing returns the privileges of role the login of q lacks, in the
// order of Required (then River's, then the warehouse's), and the login's
// name. An error is the database's (the query failed), not a verdict.
func Missing(ctx context.Context, q Querier, role Role) (missing []Privilege, login string, err error) {
	more, err := found(ctx, q, role)
	if err != nil {
		return nil, "", fmt.Errorf("listing the objects roles.sql grants on: %w", err)
	}
	all := append(Required(role), more...)
	kinds, objs, cols, modes := make([]string, len(all)), make([]string, len(all)), make([]string, len(all)), make([]string, len(all))
	for i, p := range all {
		kinds[i], objs[i], cols[i], modes[i] = p.Kind, p.Object, p.Column, p.Mode
	}
	rows, err := q.Query(ctx, checkSQL, kinds, objs, cols, modes)
	if err != nil {
		return nil, "", fmt.Errorf("checking the login's privileges: %w", err)
	}
	for rows.Next() {
		var i int64
		if err := rows.Scan(&i); err != nil {
			rows.Close()
			return nil, "", err
		}
		missing = append(missing, all[i-1])
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("checking the login's privileges: %w", err)
	}
	if err := q.QueryRow(ctx, `SELECT current_user`).Scan(&login); err != nil {
		return nil, "", err
	}
	return missing, login, nil
}

// MissingError is Check's verdict: the login lacks privileges of its role.
type MissingError struct {
	Role    Role
	Login   string
	Missing []Privilege
}

// Names returns the missing privileges as GRANT names them.
func (e *MissingError) Names() []string {
	out := make([]string, len(e.Missing))
	for i, p := range e.Missing {
		out[i] = p.String()
	}
	return out
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("database login %q lacks %d privilege(s) deploy/postgres/roles.sql grants %s: %s; "+
		"re-run deploy/postgres/roles.sql as the tables' owner (after every upgrade: its migrations may need new grants), "+
		"and make the login a member of %s (GRANT %s TO %s)",
		e.Login, len(e.Missing), e.Role, strings.Join(e.Names(), ", "), e.Role, e.Role, e.Login)
}

// ErrMissing matches every *MissingError (errors.Is).
var ErrMissing = errors.New("missing database grants")

// Is makes errors.Is(err, ErrMissing) true.
func (e *MissingError) Is(target error) bool { return target == ErrMissing }

// Check returns a *MissingError when the login of q lacks privileges of
// role, nil when it holds them all, or the database's error.
func Check(ctx context.Context, q Querier, role Role) error {
	missing, login, err := Missing(ctx, q, role)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return &MissingError{Role: role, Login: login, Missing: missing}
	}
	return nil
}
