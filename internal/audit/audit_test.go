package audit_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

func requireCode(t *testing.T, err error, code, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: not refused (%v)", what, err)
	require.Equal(t, code, pgErr.Code, "%s: %v", what, err)
}

// TestRecordAndList: a recorded action lists with who, what, why, the
// login and the database's time; an actor without a name is the login;
// long texts are cut, not refused; List filters by time and limits,
// newest first.
func TestRecordAndList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	login, err := audit.CurrentLogin(ctx, pool)
	require.NoError(t, err)

	before := time.Now().Add(-time.Minute)
	require.NoError(t, audit.Record(ctx, pool, audit.Action{
		Actor:  audit.Actor{Name: "alice", Door: audit.DoorHTTP, Note: "says mallory; from 10.0.0.1"},
		Action: audit.ActionCancel, Outcome: "cancelled", BatchID: 42, TenantID: "tenant-a", Reason: "wrong upload",
		Details: map[string]any{"cancelled_jobs": []int64{7}},
	}))
	require.NoError(t, audit.Record(ctx, pool, audit.Action{
		Actor: audit.Actor{Door: audit.DoorCLI}, Action: audit.ActionPrune, Outcome: "pruned", Reason: strings.Repeat("é", 400),
	}))
	entries, err := audit.List(ctx, pool, audit.Filter{Since: before})
	require.NoError(t, err)
	require.Len(t, entries, 2)
	p, c := entries[0], entries[1]
	require.Equal(t, audit.ActionPrune, p.Action, "newest first")
	require.Equal(t, login, p.Actor, "no name: the database login")
	require.LessOrEqual(t, len(p.Reason), 500)
	require.True(t, strings.HasSuffix(p.Reason, "…"))

	require.Equal(t, "alice", c.Actor)
	require.Equal(t, login, c.Login)
	require.Equal(t, audit.DoorHTTP, c.Door)
	require.Equal(t, int64(42), c.BatchID)
	require.Equal(t, "tenant-a", c.TenantID)
	require.Equal(t, "wrong upload", c.Reason)
	require.Equal(t, "says mallory; from 10.0.0.1", c.Note)
	require.JSONEq(t, `{"cancelled_jobs":[7]}`, string(c.Details))
	require.WithinDuration(t, time.Now(), c.At, time.Minute)

	entries, err = audit.List(ctx, pool, audit.Filter{Limit: 1})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	entries, err = audit.List(ctx, pool, audit.Filter{Since: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Empty(t, entries)
}

// TestAuditIsAppendOnlyForEveryRuntimeRole applies deploy/postgres/roles.sql
// and tries, as a login of each runtime role (the worker, the door, the
// operator), to change, delete and empty the audit: all refused 42501. The
// operators' login records and reads actions, but may not write the
// login or the time itself; even granted UPDATE and DELETE (a mistaken
// grant), the table's trigger refuses them. Its owner may delete
// (retention).
func TestAuditIsAppendOnlyForEveryRuntimeRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	pgtest.ApplyRoles(t, admin)
	require.NoError(t, audit.Record(ctx, admin, audit.Action{Actor: audit.Actor{Name: "root", Door: audit.DoorCLI}, Action: audit.ActionCancel}))

	logins := map[string]*pgxpool.Pool{}
	for _, role := range []string{"fleet_worker", "fleet_enqueue", "fleet_reconcile", "fleet_operator"} {
		logins[role] = pgtest.Pool(t, pgtest.LoginAs(t, admin, dbURL, role))
	}
	for role, pool := range logins {
		for _, sql := range []string{
			`UPDATE ingest_operator_actions SET actor = 'someone else'`,
			`UPDATE ingest_operator_actions SET reason = '' WHERE id > 0`,
			`DELETE FROM ingest_operator_actions`,
			`TRUNCATE ingest_operator_actions`,
		} {
			_, err := pool.Exec(ctx, sql)
			requireCode(t, err, "42501", role+": "+sql)
		}
	}
	for _, role := range []string{"fleet_worker", "fleet_enqueue", "fleet_reconcile"} {
		err := audit.Record(ctx, logins[role], audit.Action{Actor: audit.Actor{Name: "x", Door: audit.DoorCLI}, Action: audit.ActionCancel})
		requireCode(t, err, "42501", role+": insert")
	}

	op := logins["fleet_operator"]
	require.NoError(t, audit.Record(ctx, op, audit.Action{Actor: audit.Actor{Name: "alice", Door: audit.DoorHTTP}, Action: audit.ActionRetry, Outcome: "enqueued"}))
	entries, err := audit.List(ctx, op, audit.Filter{})
	require.NoError(t, err)
	require.Len(t, entries, 2)
	opLogin, err := audit.CurrentLogin(ctx, op)
	require.NoError(t, err)
	require.Equal(t, opLogin, entries[0].Login, "the database names the login")
	for _, sql := range []string{
		`INSERT INTO ingest_operator_actions (actor, door, action, login) VALUES ('alice', 'cli', 'cancel', 'someone_else')`,
		`INSERT INTO ingest_operator_actions (actor, door, action, at) VALUES ('alice', 'cli', 'cancel', now() - interval '1 year')`,
	} {
		_, err := op.Exec(ctx, sql)
		requireCode(t, err, "42501", "operator: "+sql)
	}

	// A mistaken grant does not open it: the trigger refuses.
	_, err = admin.Exec(ctx, `GRANT UPDATE, DELETE ON ingest_operator_actions TO fleet_operator`)
	require.NoError(t, err)
	for _, sql := range []string{`UPDATE ingest_operator_actions SET actor = 'someone else'`, `DELETE FROM ingest_operator_actions`} {
		_, err := op.Exec(ctx, sql)
		requireCode(t, err, "42501", "operator with a grant: "+sql)
	}
	pgtest.ApplyRoles(t, admin) // and a re-run of roles.sql takes the grant back
	var grants int
	require.NoError(t, admin.QueryRow(ctx, `
		SELECT count(*) FROM information_schema.role_table_grants
		WHERE table_name = 'ingest_operator_actions' AND grantee LIKE 'fleet_%' AND privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE')`).Scan(&grants))
	require.Zero(t, grants)

	entries, err = audit.List(ctx, admin, audit.Filter{})
	require.NoError(t, err)
	require.Len(t, entries, 2, "nothing changed")
	require.Equal(t, "alice", entries[0].Actor)

	// The owner may delete old rows.
	tag, err := admin.Exec(ctx, `DELETE FROM ingest_operator_actions WHERE actor = 'root'`)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
}

// TestRecordGoesWithItsTransaction: a row recorded in a transaction that
// rolls back is gone with it.
func TestRecordGoesWithItsTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := audit.Record(ctx, tx, audit.Action{Actor: audit.Actor{Name: "alice", Door: audit.DoorCLI}, Action: audit.ActionResume}); err != nil {
			return err
		}
		return errors.New("rolled back")
	})
	require.Error(t, err)
	entries, err := audit.List(ctx, pool, audit.Filter{})
	require.NoError(t, err)
	require.Empty(t, entries)
}

// TestDetailsAreJSON: details that cannot be marshalled fail the record,
// before the database.
func TestDetailsAreJSON(t *testing.T) {
	t.Parallel()
	err := audit.Record(context.Background(), nil, audit.Action{Action: audit.ActionCancel, Details: map[string]any{"f": func() {}}})
	require.Error(t, err)
	var js *json.UnsupportedTypeError
	require.True(t, errors.As(err, &js), "%v", err)
}
