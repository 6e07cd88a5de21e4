package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestWorkerRefusesALoginMissingGrants: after an upgrade whose roles.sql
// was not re-run (here: a column of the worker's UPDATE list revoked, and a
// River table added), worker run as a member of fleet_worker does not
// start: it exits cli.ExitMissingGrants (10) and its log names each
// privilege missing and the remedy.
func TestWorkerRefusesALoginMissingGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	pgtest.ApplyRoles(t, admin)
	workerURL := pgtest.LoginAs(t, admin, dbURL, "fleet_worker")
	for _, sql := range []string{
		`REVOKE UPDATE (parked_reason) ON ingestion_batches FROM fleet_worker`,
		`CREATE TABLE river_added_by_an_upgrade (id bigint)`,
	} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"run", "--database-url", workerURL, "--metrics-addr", "127.0.0.1:0", "--lease-ttl", "3s", "--lease-renew-every", "1s"}, &stdout, &stderr)
	require.Equal(t, cli.ExitMissingGrants, code, stderr.String())
	var entry struct {
		Msg     string   `json:"msg"`
		Role    string   `json:"role"`
		Missing []string `json:"missing"`
		Error   string   `json:"error"`
	}
	var line string
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(l, "lacks grants") {
			line = l
			break
		}
	}
	require.NoError(t, json.Unmarshal([]byte(line), &entry), stderr.String())
	require.Equal(t, "not starting: the database login lacks grants of deploy/postgres/roles.sql", entry.Msg)
	require.Equal(t, "fleet_worker", entry.Role)
	require.Equal(t, []string{"UPDATE (parked_reason) ON ingestion_batches",
		"SELECT ON river_added_by_an_upgrade", "INSERT ON river_added_by_an_upgrade", "UPDATE ON river_added_by_an_upgrade", "DELETE ON river_added_by_an_upgrade"}, entry.Missing)
	require.Contains(t, entry.Error, "re-run deploy/postgres/roles.sql")
}
