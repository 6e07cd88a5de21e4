package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestServeIsNotReadyOnAnUnmigratedDatabase: enqueue serve checks the
// schema version as the worker does. Started on a fresh empty database,
// or one behind this build, it does not start: no listener, exit 1, and a
// log line (and the error outcome line) saying why and to run `worker
// migrate` — where it used to report ready and answer every import 503.
// The pod restarts until the migrations ran, as a worker's does.
func TestServeIsNotReadyOnAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"empty": pgtest.EmptyDatabaseURL(t), "behind": pgtest.NewDatabaseURLAt(t, 1)} {
		cmd := exec.Command(filepath.Join(binDir, "enqueue"), "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--insecure-no-auth")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "LOG_FORMAT=json")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		done := make(chan error, 1)
		require.NoError(t, cmd.Start())
		go func() { done <- cmd.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("%s: serve did not stop on an unmigrated database: %s", name, stderr.String())
		}
		var exitErr *exec.ExitError
		require.True(t, errors.As(err, &exitErr), "%s: %v", name, err)
		require.Equal(t, 1, exitErr.ExitCode(), name)
		logs := stderr.String()
		require.NotContains(t, logs, "listening for upload notifications", name)
		require.NotContains(t, logs, "admin listener started", name)
		require.Contains(t, logs, `"level":"ERROR"`, name)
		require.Contains(t, logs, "not starting: ", name)
		require.Contains(t, logs, "run `worker migrate` first", name)
		require.Contains(t, stdout.String(), `"outcome":"error"`, name)
		want := map[string]string{"empty": "the database has no schema", "behind": "the database schema is at migration 1, this build needs"}[name]
		require.Contains(t, logs, want, name)
	}
}

// TestServeReadyzChecksTheSchema: /readyz asks at every probe: a database
// whose schema falls behind this build (restored from an old backup, a
// connection string pointed elsewhere) answers 503 with why, and ready
// again once it is migrated.
func TestServeReadyzChecksTheSchema(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	serve, _ := startServe(t, dbURL, nil, "--insecure-no-auth")
	pgtest.RequireReadyzFollowsSchema(t, pool, "http://"+adminAddr(t, serve)+"/readyz")
}
