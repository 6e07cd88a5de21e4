package grants_test

import (
	"context"
	"errors"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/grants"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

var roles = []grants.Role{grants.Worker, grants.Enqueue, grants.Reconcile, grants.Operator}

// TestRolesSQLGrantsWhatEachRoleNeeds: after deploy/postgres/roles.sql, a
// login in each group holds every privilege its role is checked for (so
// the check never asks for a grant roles.sql does not make), and so does
// the superuser that owns the tables. The checks cover the objects found
// in the database: every River table (the worker's four privileges, the
// operator's SELECT) and the local warehouse's.
func TestRolesSQLGrantsWhatEachRoleNeeds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	pgtest.ApplyRoles(t, admin)
	for _, role := range roles {
		require.NoError(t, grants.Check(ctx, admin, role), "the owner, %s", role)
		login := pgtest.Pool(t, pgtest.LoginAs(t, admin, dbURL, string(role)))
		missing, name, err := grants.Missing(ctx, login, role)
		require.NoError(t, err)
		require.Empty(t, missing, "%s (%s) after roles.sql", role, name)
	}
	// The found objects are checked: River's tables, the warehouse's.
	login := pgtest.Pool(t, pgtest.LoginAs(t, admin, dbURL, string(grants.Enqueue)))
	missing, _, err := grants.Missing(ctx, login, grants.Worker)
	require.NoError(t, err)
	names := (&grants.MissingError{Missing: missing}).Names()
	for _, want := range []string{"DELETE ON river_job", "UPDATE ON river_leader",
		"INSERT ON curated.fleet_records", "USAGE ON SCHEMA curated", "UPDATE (parked_at) ON ingestion_batches"} {
		require.Contains(t, names, want, "the door's login is no worker")
	}
	require.NotContains(t, names, "SELECT ON ingestion_batches", "the door's login reads batches")

	// The door's login is not reconcile: it holds no grant on reconcile's
	// checkpoints (issue 44: it cannot move one), and nothing else
	// reconcile needs is missing from it.
	missing, _, err = grants.Missing(ctx, login, grants.Reconcile)
	require.NoError(t, err)
	require.Equal(t, []string{"SELECT ON ingest_reconcile_checkpoints", "INSERT ON ingest_reconcile_checkpoints", "UPDATE ON ingest_reconcile_checkpoints"},
		(&grants.MissingError{Missing: missing}).Names(), "the door's login lacks exactly reconcile's checkpoints")
}

// TestMissingGrantsAreNamed: privileges taken away after roles.sql (a
// column of the worker's UPDATE list, the door's checkpoints, the
// operator's prune policy) and a River table added after it (as an upgrade
// whose migrations recreate River's tables does) are named, each, in the
// role's order, with the login and the remedy; running roles.sql again
// restores every role.
func TestMissingGrantsAreNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	pgtest.ApplyRoles(t, admin)
	logins := map[grants.Role]string{}
	for _, role := range roles {
		logins[role] = pgtest.LoginAs(t, admin, dbURL, string(role))
	}
	for _, sql := range []string{
		`REVOKE UPDATE (parked_at, parked_reason) ON ingestion_batches FROM fleet_worker`,
		`REVOKE ALL ON ingest_reconcile_checkpoints FROM fleet_reconcile`,
		`REVOKE EXECUTE ON FUNCTION ingest_prune_signatures() FROM fleet_enqueue`,
		`DROP POLICY fleet_operator_prune ON ingestion_batches`,
		`CREATE TABLE river_added_by_an_upgrade (id bigint)`,
	} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	want := map[grants.Role][]string{
		grants.Worker: {"UPDATE (parked_at) ON ingestion_batches", "UPDATE (parked_reason) ON ingestion_batches",
			"SELECT ON river_added_by_an_upgrade", "INSERT ON river_added_by_an_upgrade", "UPDATE ON river_added_by_an_upgrade", "DELETE ON river_added_by_an_upgrade"},
		grants.Enqueue:   {"EXECUTE ON FUNCTION ingest_prune_signatures()"},
		grants.Reconcile: {"SELECT ON ingest_reconcile_checkpoints", "INSERT ON ingest_reconcile_checkpoints", "UPDATE ON ingest_reconcile_checkpoints"},
		grants.Operator:  {"a row-level security policy FOR DELETE ON ingestion_batches", "SELECT ON river_added_by_an_upgrade"},
	}
	for _, role := range roles {
		pool := pgtest.Pool(t, logins[role])
		err := grants.Check(ctx, pool, role)
		var missing *grants.MissingError
		require.True(t, errors.As(err, &missing), "%s: %v", role, err)
		require.ErrorIs(t, err, grants.ErrMissing)
		require.Equal(t, want[role], missing.Names(), role)
		require.Equal(t, role, missing.Role)
		require.Contains(t, err.Error(), "database login \""+missing.Login+"\" lacks")
		require.Contains(t, err.Error(), "re-run deploy/postgres/roles.sql")
		for _, name := range want[role] {
			require.Contains(t, err.Error(), name)
		}
	}

	pgtest.ApplyRoles(t, admin)
	for _, role := range roles {
		require.NoError(t, grants.Check(ctx, pgtest.Pool(t, logins[role]), role), "%s after roles.sql ran again", role)
	}
}

// TestALoginInNoGroupLacksEverything: a login that may connect but is in
// none of the groups (the setup step forgotten) lacks every privilege of
// each role's list, and the error says which group to grant it.
func TestALoginInNoGroupLacksEverything(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	pgtest.ApplyRoles(t, admin)
	// A login of its own, allowed to connect (roles.sql revokes CONNECT
	// from PUBLIC) and nothing else.
	var name string
	require.NoError(t, admin.QueryRow(ctx, `SELECT 'fleet_grants_nobody_' || pg_backend_pid()`).Scan(&name))
	_, err := admin.Exec(ctx, `CREATE ROLE `+name+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name)
		_, _ = admin.Exec(context.Background(), `DROP OWNED BY `+name)
		_, _ = admin.Exec(context.Background(), `DROP ROLE IF EXISTS `+name)
	})
	_, err = admin.Exec(ctx, `DO $$ BEGIN EXECUTE format('GRANT CONNECT ON DATABASE %I TO `+name+`', current_database()); END $$`)
	require.NoError(t, err)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(name)
	pool := pgtest.Pool(t, u.String())
	for _, role := range roles {
		err := grants.Check(ctx, pool, role)
		var missing *grants.MissingError
		require.True(t, errors.As(err, &missing), "%s: %v", role, err)
		require.Equal(t, name, missing.Login)
		for _, p := range grants.Required(role) {
			require.Contains(t, missing.Missing, p, "%s: %s", role, p)
		}
		require.Contains(t, err.Error(), "GRANT "+string(role)+" TO "+name)
	}
}
