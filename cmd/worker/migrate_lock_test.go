package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestMigrateExitsLockTimeoutNamingTheBlocker: a database at the baseline
// (migration 2 alters ingestion_batches) and a session that keeps a read of
// ingestion_batches open. worker migrate gives way on every attempt and
// exits 6 (cli.ExitLockTimeout), its log naming the session; once that
// session commits, the same command applies everything.
func TestMigrateExitsLockTimeoutNamingTheBlocker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabaseURLAt(t, 1)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = "grafana-test"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx) //nolint:errcheck
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM ingestion_batches`)
	require.NoError(t, err)

	// A lock timeout of 1 s gives the watcher (polling every quarter of
	// it) four looks at each wait; with 100 ms a loaded machine once let a
	// whole wait pass between two polls, and the first warning named no
	// one.
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"migrate", "--database-url", url, "--lock-timeout", "1s", "--lock-attempts", "2"}, &stdout, &stderr)
	require.Equal(t, cli.ExitLockTimeout, code, stderr.String())
	require.Contains(t, stderr.String(), `"blocker_application_name":"grafana-test"`, "each time it gives way, it says to whom")
	require.Contains(t, stderr.String(), `application_name \"grafana-test\"`, "the final error names the blocker")
	require.Contains(t, stderr.String(), "idle in transaction")

	require.NoError(t, tx.Commit(ctx))
	stdout.Reset()
	stderr.Reset()
	code = run(ctx, []string{"migrate", "--database-url", url, "--lock-timeout", "100ms", "--lock-attempts", "2"}, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, stderr.String())
	require.Contains(t, stdout.String(), "applied project migration 2 ")
}

func TestMigrateLockFlagsAreChecked(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--lock-timeout", "0s"},
		{"--lock-timeout", "2m"},
		{"--lock-attempts", "0"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"migrate", "--database-url", "postgres://127.0.0.1:1/x"}, args...), &stdout, &stderr)
		require.Equal(t, cli.ExitInvalidInput, code, "%v: %s", args, stderr.String())
		require.Contains(t, stderr.String(), args[0])
	}
}
