package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestDropTemplatesWaitsForTheirUsers: templates are not dropped while a
// test binary holds the shared lock; once none does, every template (and
// only templates: a kept test database stays) is dropped. The test uses a
// lock key and names of its own, so it neither waits for nor disturbs the
// test binaries running beside it.
func TestDropTemplatesWaitsForTheirUsers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := ServerURL(t)
	admin, err := pgx.Connect(ctx, server)
	require.NoError(t, err)
	defer admin.Close(ctx)

	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "pgtestcheck_" + hex.EncodeToString(b)
	template, instance := prefix+"_tpl", prefix+"_tpl_inst_1"
	for _, name := range []string{template, instance} {
		_, err := admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
		require.NoError(t, err)
	}
	_, err = admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{template}.Sanitize()+` IS_TEMPLATE true`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `ALTER DATABASE `+pgx.Identifier{template}.Sanitize()+` IS_TEMPLATE false`)
		for _, name := range []string{template, instance} {
			_, _ = admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
		}
	})
	key := int64(b[0])<<24 | int64(b[1])<<16 | int64(b[2])<<8 | int64(b[3]) | 1<<40
	pattern := "^" + prefix + "_tpl$"

	// A test binary using the templates holds the shared lock.
	user, err := pgx.Connect(ctx, server)
	require.NoError(t, err)
	_, err = user.Exec(ctx, `SELECT pg_advisory_lock_shared($1)`, key)
	require.NoError(t, err)
	dropped, left, busy, err := dropTemplates(ctx, server, key, pattern)
	require.NoError(t, err)
	require.True(t, busy)
	require.Empty(t, dropped)
	require.Equal(t, []string{template}, left)

	require.NoError(t, user.Close(ctx)) // the binary exits
	dropped, left, busy, err = dropTemplates(ctx, server, key, pattern)
	require.NoError(t, err)
	require.False(t, busy)
	require.Equal(t, []string{template}, dropped)
	require.Empty(t, left)
	var names []string
	rows, err := admin.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE $1 ORDER BY 1`, prefix+"%")
	require.NoError(t, err)
	names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{instance}, names, "a kept test database is not a template")
}

// TestNewDatabaseHoldsTheTemplatesLock: a process that has cloned a test
// database holds the templates' lock, so DropTemplates leaves them, and
// goes on holding it through garbage collections (the lock's connection
// once became garbage, and its socket's finalizer ended the session).
func TestNewDatabaseHoldsTheTemplatesLock(t *testing.T) {
	t.Parallel()
	NewDatabaseURL(t)
	for range 3 {
		runtime.GC()
		time.Sleep(50 * time.Millisecond) // finalizers run on a goroutine of their own
	}
	// Not by calling DropTemplates: should the lock be missing, that would
	// drop the templates under the test binaries running beside this one.
	// A try of the exclusive lock, released at once, tells the same.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, ServerURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var locked bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, templatesLockKey).Scan(&locked))
	require.False(t, locked, "this process holds the templates' shared lock")
}
