package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestCommandsRefuseALoginMissingGrants: a database where roles.sql was
// not re-run for the doors' replay records (a grant revoked) and the
// operators' prune policy (dropped): enqueue serve, sqs and reconcile (one
// shot and --every) as the doors' login, and enqueue prune as the
// operators', do not start. Each exits cli.ExitMissingGrants (10), with a
// log line and an outcome line naming every privilege missing and the
// remedy; enqueue serve's operator surfaces on a login that is no operator
// (the doors') likewise. With roles.sql run again, they pass the check.
func TestCommandsRefuseALoginMissingGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	pgtest.ApplyRoles(t, admin)
	enqueueURL := pgtest.LoginAs(t, admin, dbURL, "fleet_enqueue")
	reconcileURL := pgtest.LoginAs(t, admin, dbURL, "fleet_reconcile")
	operatorURL := pgtest.LoginAs(t, admin, dbURL, "fleet_operator")
	for _, sql := range []string{
		`REVOKE EXECUTE ON FUNCTION ingest_prune_signatures() FROM fleet_enqueue`,
		`REVOKE UPDATE ON ingest_reconcile_checkpoints FROM fleet_reconcile`,
		`DROP POLICY fleet_operator_prune ON ingestion_batches`,
	} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	opToken := filepath.Join(t.TempDir(), "operator-token")
	require.NoError(t, os.WriteFile(opToken, []byte("operator-token-for-the-grants-test"), 0o600))

	doors := []string{"EXECUTE ON FUNCTION ingest_prune_signatures()"}
	// Reconcile still run under the doors' login (an install upgraded
	// without giving reconcile its own, issue 44): it lacks every grant of
	// the checkpoints, which roles.sql gives fleet_reconcile only.
	checkpoints := []string{"SELECT ON ingest_reconcile_checkpoints", "INSERT ON ingest_reconcile_checkpoints", "UPDATE ON ingest_reconcile_checkpoints"}
	for _, c := range []struct {
		url     string
		args    []string
		role    string
		missing []string
	}{
		{enqueueURL, []string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--insecure-no-auth"}, "fleet_enqueue", doors},
		{enqueueURL, []string{"sqs", "--queue-url", "http://127.0.0.1:1/000000000000/uploads", "--admin-listen", "127.0.0.1:0"}, "fleet_enqueue", doors},
		{enqueueURL, []string{"reconcile", "--bucket", "fleet-uploads", "--every", "1m", "--admin-listen", "127.0.0.1:0"}, "fleet_reconcile", checkpoints},
		{enqueueURL, []string{"reconcile", "--bucket", "fleet-uploads"}, "fleet_reconcile", checkpoints},
		{reconcileURL, []string{"reconcile", "--bucket", "fleet-uploads", "--every", "1m", "--admin-listen", "127.0.0.1:0"}, "fleet_reconcile", []string{"UPDATE ON ingest_reconcile_checkpoints"}},
		{operatorURL, []string{"prune", "--older-than", "90d"}, "fleet_operator", []string{"a row-level security policy FOR DELETE ON ingestion_batches"}},
	} {
		stdout, stderr, code := runGrants(t, c.url, c.args...)
		require.Equal(t, cli.ExitMissingGrants, code, "%v\n%s\n%s", c.args, stdout, stderr)
		requireMissing(t, c.args[0], stdout, stderr, c.role, c.missing)
		if c.role == "fleet_reconcile" {
			require.Contains(t, stdout, "GRANT fleet_reconcile TO", "the remedy names reconcile's role")
		}
	}

	// The operator surfaces on the doors' login: serve starts its door,
	// checks the operator login and refuses it.
	_, err := admin.Exec(ctx, `GRANT EXECUTE ON FUNCTION ingest_prune_signatures() TO fleet_enqueue`)
	require.NoError(t, err)
	stdout, stderr, code := runGrants(t, enqueueURL, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--insecure-no-auth",
		"--operator-token-file", opToken, "--operator-database-url", enqueueURL)
	require.Equal(t, cli.ExitMissingGrants, code, "%s\n%s", stdout, stderr)
	requireMissing(t, "serve --operator-database-url", stdout, stderr, "fleet_operator",
		[]string{"UPDATE ON river_job", "DELETE ON ingestion_batches", "DELETE ON river_job"}) // the door's login holds the cancel columns (a tenant's cancel, issue 45), not River's jobs

	// roles.sql run again: prune passes the check and runs.
	pgtest.ApplyRoles(t, admin)
	stdout, stderr, code = runGrants(t, operatorURL, "prune", "--older-than", "90d")
	require.Equal(t, cli.ExitOK, code, "%s\n%s", stdout, stderr)
	require.Contains(t, stdout, `"outcome":"would_prune"`)
}

func runGrants(t *testing.T, url string, args ...string) (string, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code := run(ctx, append(args, "--database-url", url), &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

// requireMissing checks the outcome line and the log line of a refused
// start: the role, every privilege missing, the remedy.
func requireMissing(t *testing.T, what, stdout, stderr, role string, want []string) {
	t.Helper()
	var o struct {
		Outcome string   `json:"outcome"`
		Role    string   `json:"role"`
		Missing []string `json:"missing"`
		Error   string   `json:"error"`
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &o), "%s: %s", what, stdout)
	require.Equal(t, "missing_grants", o.Outcome, what)
	require.Equal(t, role, o.Role, what)
	for _, w := range want {
		require.Contains(t, o.Missing, w, what)
		require.Contains(t, stderr, w, "%s: the log names it", what)
	}
	require.Contains(t, o.Error, "re-run deploy/postgres/roles.sql", what)
	require.Contains(t, stderr, `"msg":"not starting: the database login lacks grants of deploy/postgres/roles.sql"`, what)
}
