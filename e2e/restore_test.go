package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/notify"
	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// restoreWarehouse is the warehouse a restore scenario keeps while the
// operational database goes back in time: what the worker and its migrate
// are given, and the database holding the curated tables.
type restoreWarehouse struct {
	env          []string
	migrateFlags []string
	workerFlags  []string
	pool         *pgxpool.Pool
}

// localRestoreWarehouse is the local warehouse in a database of its own
// (--warehouse-url): a restore of the operational database leaves it as
// it is, as it would Redshift.
func localRestoreWarehouse(t *testing.T) restoreWarehouse {
	url := pgtest.EmptyDatabaseURL(t)
	flags := []string{"--warehouse-url", url}
	return restoreWarehouse{migrateFlags: flags, workerFlags: flags, pool: pgtest.Pool(t, url)}
}

// redshiftRestoreWarehouse is the Redshift Data API double (workers as the
// loader, migrate as the owner).
func redshiftRestoreWarehouse(t *testing.T) restoreWarehouse {
	env, migrateFlags, workerFlags, pool := redshiftWarehouse(t)
	return restoreWarehouse{env: env, migrateFlags: migrateFlags, workerFlags: workerFlags, pool: pool}
}

// workerMigrate runs worker migrate on dbURL with the warehouse's flags
// and environment and returns its output.
func workerMigrate(t *testing.T, dbURL string, wh restoreWarehouse) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "worker"), append([]string{"migrate"}, wh.migrateFlags...)...)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+dbURL), wh.env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "worker migrate: %s", out)
	return string(out)
}

// pgTool runs a PostgreSQL client tool (pg_dump, pg_restore) of the
// server's installation.
func pgTool(t *testing.T, tool string, args ...string) {
	t.Helper()
	bin, err := chaos.FindPGBin()
	require.NoError(t, err)
	out, err := exec.Command(filepath.Join(bin, tool), args...).CombinedOutput()
	require.NoError(t, err, "%s: %s", tool, out)
}

// importFolder imports a folder (a re-import when reimport) and returns
// the outcome's batch id.
func importFolder(t *testing.T, dbURL, tenant, folderURL string, reimport bool) int64 {
	t.Helper()
	args := importArgs(tenant, folderURL)
	if reimport {
		args = append(args, "--reimport")
	}
	out, code := runEnqueue(t, dbURL, args...)
	require.Equal(t, 0, code, out)
	o := outcome(t, out)
	require.Equal(t, "enqueued", o["outcome"], out)
	require.NotEmpty(t, o["batch_uid"], "a receipt names the batch by its uid: %s", out)
	return int64(o["batch_id"].(float64))
}

// warehouseBatchIDs is every batch id the warehouse names: stamps,
// publications, ledger and load errors.
func warehouseBatchIDs(t *testing.T, pool *pgxpool.Pool) map[int64]bool {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT batch_id FROM curated.fleet_slices UNION SELECT batch_id FROM curated.fleet_publications
		UNION SELECT batch_id FROM curated.fleet_load_objects UNION SELECT batch_id FROM curated.fleet_load_errors`)
	require.NoError(t, err)
	ids := map[int64]bool{}
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids[id] = true
	}
	require.NoError(t, rows.Err())
	return ids
}

// requireExactSlice checks that the warehouse slice of the folder holds
// exactly the folder's records, once each, loaded by b and stamped with
// its id and uid, and that b was published exactly once.
func requireExactSlice(t *testing.T, pool *pgxpool.Pool, tenant string, b batch.Batch, records int) {
	t.Helper()
	ctx := context.Background()
	var total, distinct int
	var ids []int64
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*), count(DISTINCT (object_key, line_number)), COALESCE(array_agg(DISTINCT batch_id), '{}')
		FROM curated.fleet_records WHERE tenant_id = $1 AND source_scope = $2`, tenant, b.Scope()).Scan(&total, &distinct, &ids))
	require.Equal(t, records, total, "batch %d: the slice holds the folder's records", b.ID)
	require.Equal(t, records, distinct, "batch %d: once each", b.ID)
	require.Equal(t, []int64{b.ID}, ids, "batch %d: loaded by the folder's newest batch", b.ID)
	var stampID int64
	var stampUID *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT batch_id, batch_uid FROM curated.fleet_slices WHERE tenant_id = $1 AND source_scope = $2`,
		tenant, b.Scope()).Scan(&stampID, &stampUID))
	require.Equal(t, b.ID, stampID)
	require.NotNil(t, stampUID)
	require.Equal(t, b.UID, *stampUID, "the stamp names the batch by its uid too")
	var published int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_publications
		WHERE tenant_id = $1 AND source_scope = $2 AND batch_id = $3 AND batch_uid = $4`, tenant, b.Scope(), b.ID, b.UID).Scan(&published))
	require.Equal(t, 1, published, "batch %d published once", b.ID)
}

// TestRestoreBehindTheWarehouse is the restore of the operational database
// from a backup while the warehouse, a database of its own, keeps every
// slice it committed: three folders loaded; a dump; three more folders
// loaded and the first three loaded again (batches 4–9, stamped in the
// warehouse, notified); the database restored from the dump into a new
// database (it knows batches 1–3, its sequence stands at 3); worker
// migrate; every folder imported again. Every folder's newest batch
// succeeds with an exact slice, stamped with its id and uid (before:
// three of six ended Failed/superseded, "warehouse slice is stamped with
// newer batch 7"); no batch id handed out after the restore is one the
// warehouse names; no notification key of an outcome after the restore
// is one sent before it. On the local warehouse in its own database and
// on the Redshift Data API double.
//
// Each load meets a stamp of a batch the restored database does not know
// and takes it over: counted (ingest_forgotten_stamps_total), recorded in
// the batch's details and shown by enqueue status. A third run skips
// worker migrate (as a failover to a standby that was behind would, with
// no step of the runbook run): the new batches are handed the ids 4–9
// again, loads meet forgotten stamps of higher ids, and still no folder is
// blocked.
func TestRestoreBehindTheWarehouse(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		warehouse func(*testing.T) restoreWarehouse
		migrate   bool
	}{
		{"postgres", localRestoreWarehouse, true},
		{"redshift", redshiftRestoreWarehouse, true},
		{"redshift-without-migrate", redshiftRestoreWarehouse, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			restoreScenario(t, c.warehouse(t), c.migrate)
		})
	}
}

func restoreScenario(t *testing.T, wh restoreWarehouse, migrate bool) {
	ctx := context.Background()
	const tenant = "tenant-restore"
	opURL := pgtest.EmptyDatabaseURL(t)
	workerMigrate(t, opURL, wh)

	rc := &webhookReceiver{secret: []byte("tenant-restore-webhook-secret"), received: map[string][]notify.Notification{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	file := filepath.Join(t.TempDir(), "notifications.json")
	require.NoError(t, os.WriteFile(file, fmt.Appendf(nil,
		`{"tenants": {%q: [{"name": "hook", "kind": "webhook", "url": %q, "secret": %q}]}}`, tenant, srv.URL+"/fleet", rc.secret), 0o600))
	workerArgs := append(append(slices.Clone(fastLease), "--notifications-file", file, "--notify-retry-base", "200ms"), wh.workerFlags...)

	folders := make([]string, 6)
	for i := range folders {
		folders[i] = writeFolder(t, sample)
	}
	waitAll := func(pool *pgxpool.Pool, ids []int64) []batch.Batch {
		t.Helper()
		out := make([]batch.Batch, len(ids))
		for i, id := range ids {
			out[i] = waitStatus(t, pool, id, batch.StatusSucceeded, 2*time.Minute)
		}
		return out
	}
	waitNotified := func(bs []batch.Batch) {
		t.Helper()
		require.Eventually(t, func() bool {
			got, _ := rc.snapshot()
			for _, b := range bs {
				if len(got[notify.Key(b.Ref(), notify.OutcomeSucceeded, b.LeaseGeneration)]) == 0 {
					return false
				}
			}
			return true
		}, time.Minute, 100*time.Millisecond, "every outcome notified")
	}

	// Before the backup: batches 1–3.
	pool := pgtest.Pool(t, opURL)
	w := startWorkerEnv(t, opURL, wh.env, workerArgs...)
	var first []int64
	for _, f := range folders[:3] {
		first = append(first, importFolder(t, opURL, tenant, f, false))
	}
	waitNotified(waitAll(pool, first))
	dump := filepath.Join(t.TempDir(), "operational.dump")
	pgTool(t, "pg_dump", "--format=custom", "--file", dump, "--dbname", opURL)

	// After it: three new folders and the first three again (4–9).
	var later []int64
	for _, f := range folders[3:] {
		later = append(later, importFolder(t, opURL, tenant, f, false))
	}
	for _, f := range folders[:3] {
		later = append(later, importFolder(t, opURL, tenant, f, true))
	}
	laterBatches := waitAll(pool, later)
	waitNotified(laterBatches)
	w.signal(syscall.SIGTERM)
	require.Equal(t, 0, w.wait(time.Minute))
	pool.Close()

	named := warehouseBatchIDs(t, wh.pool)
	for _, id := range append(slices.Clone(first), later...) {
		require.True(t, named[id], "the warehouse names batch %d", id)
	}
	before, _ := rc.snapshot()
	require.Len(t, before, 9, "nine outcomes notified before the restore")

	// The restore: a new database from the dump, which knows 1–3 only.
	restored := pgtest.EmptyDatabaseURL(t)
	pgTool(t, "pg_restore", "--no-owner", "--exit-on-error", "--dbname", restored, dump)
	pool = pgtest.Pool(t, restored)
	var last int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(id) FROM ingestion_batches`).Scan(&last))
	require.Equal(t, first[2], last, "the restored database forgot batches 4–9")
	if migrate {
		out := workerMigrate(t, restored, wh)
		require.Contains(t, out, fmt.Sprintf("the warehouse names batches up to %d", slices.Max(later)), out)
	}

	// Every folder imported again.
	w = startWorkerEnv(t, restored, wh.env, workerArgs...)
	var after []int64
	for i, f := range folders {
		after = append(after, importFolder(t, restored, tenant, f, i < 3))
	}
	afterBatches := waitAll(pool, after)
	waitNotified(afterBatches)
	for i, b := range afterBatches {
		if migrate {
			require.False(t, named[b.ID], "batch %d: an id the warehouse names was handed out again", b.ID)
		}
		require.NotEmpty(t, b.UID)
		for _, old := range laterBatches {
			require.NotEqual(t, old.UID, b.UID)
		}
		requireExactSlice(t, wh.pool, tenant, b, sampleRecords)
		require.Equal(t, folders[i], strings.TrimPrefix(b.Scope(), folder.ScopePrefix))
	}
	// The chaos suite's identity invariants agree: every slice and
	// publication names its folder's newest batch by uid, no uid names two
	// ids, and, after worker migrate, no id names two uids.
	var expect []chaos.Expectation
	for _, b := range afterBatches {
		expect = append(expect, chaos.Expectation{TenantID: tenant, Scope: b.Scope(), Records: sampleRecords})
	}
	identity, err := chaos.CheckIdentity(ctx, pool, wh.pool, expect, migrate)
	require.NoError(t, err)
	require.Empty(t, identity.Skipped)
	require.Empty(t, identity.Violations)
	require.Equal(t, 6, identity.Forgotten, "batches 4–9 are named by the warehouse and forgotten by the database")
	got, unsigned := rc.snapshot()
	require.Zero(t, unsigned)
	for _, b := range afterBatches {
		key := notify.Key(b.Ref(), notify.OutcomeSucceeded, b.LeaseGeneration)
		require.NotContains(t, before, key, "a key sent before the restore names a new outcome")
		require.Len(t, got[key], 1, "one notification per outcome")
	}
	for key, ns := range got {
		for _, n := range ns[1:] {
			require.Equal(t, ns[0].Outcome, n.Outcome, "one key, one outcome: %s", key)
			require.Equal(t, ns[0].BatchUID, n.BatchUID, "one key, one batch: %s", key)
		}
	}

	// Every load met a stamp of a batch this database does not know (with
	// worker migrate, of a lower id than its own; without, the new batches
	// were handed 4–9 again): each counted and recorded.
	require.Equal(t, float64(len(after)), w.metric("ingest_forgotten_stamps_total"))
	for _, b := range afterBatches {
		_, d := getBatch(t, pool, b.ID)
		require.NotNil(t, d.TookOver, "batch %d records the forgotten stamp it took over", b.ID)
		require.NotEqual(t, b.UID, d.TookOver.BatchUID)
	}
	out, code := runEnqueue(t, restored, "status", "--batch-id", fmt.Sprint(afterBatches[0].ID))
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "took over: the warehouse slice was stamped with batch", out)
}
