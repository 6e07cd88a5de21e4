package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/uploads"
)

var roleSeq atomic.Int64

// loginAs creates a login role that is a member of group and returns dbURL
// rewritten to connect as it (pgtest.LoginAs).
func loginAs(t *testing.T, admin *pgxpool.Pool, dbURL, group string) string {
	t.Helper()
	return pgtest.LoginAs(t, admin, dbURL, group)
}

// applyRoles runs deploy/postgres/roles.sql (pgtest.ApplyRoles).
func applyRoles(t *testing.T, admin *pgxpool.Pool) {
	t.Helper()
	pgtest.ApplyRoles(t, admin)
}

// requireDenied runs sql and expects SQLSTATE 42501 (insufficient
// privilege, which is also the code of a row-level security violation),
// with the message containing want.
func requireDenied(t *testing.T, pool *pgxpool.Pool, want, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: %v", sql, err)
	require.Equal(t, "42501", pgErr.Code, "%s: %v", sql, err)
	require.Contains(t, pgErr.Message, want, sql)
}

func requirePermissionDenied(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	requireDenied(t, pool, "", sql)
}

// TestLeastPrivilegeRoles runs both binaries as the roles of
// deploy/postgres/roles.sql, end to end (CLI import as the door's login;
// resume, cancel and retry as the operator's, which the door's may not do;
// enqueue serve as the door with its cancel route and River UI as the
// operator, a signed request and its replay; the worker), and checks each
// thing those roles may not do: no DDL, no re-tenanting or re-scoping of a
// batch, no success declared by enqueue, no temporary objects, no session
// for a role that is not theirs. deploy/postgres holds each forbidden write
// per login.
func TestLeastPrivilegeRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	applyRoles(t, admin)
	applyRoles(t, admin) // idempotent
	workerURL := loginAs(t, admin, dbURL, "fleet_worker")
	enqueueURL := loginAs(t, admin, dbURL, "fleet_enqueue")
	operatorURL := loginAs(t, admin, dbURL, "fleet_operator")

	startWorker(t, workerURL, fastLease...)
	folderURL := writeFolder(t, sample)
	id := enqueueBatch(t, enqueueURL, "tenant-a", folderURL)
	waitStatus(t, admin, id, batch.StatusSucceeded, 30*time.Second)

	// Resume as the operator role, after a publication failure; the door's
	// role may not.
	_, err := admin.Exec(ctx, `
		CREATE FUNCTION curated.fail_publication() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'down'; END $$;
		CREATE TRIGGER fail_publication BEFORE INSERT ON curated.fleet_publications FOR EACH ROW EXECUTE FUNCTION curated.fail_publication();`)
	require.NoError(t, err)
	other := writeFolder(t, sample)
	id2 := enqueueBatch(t, enqueueURL, "tenant-a", other)
	waitStatus(t, admin, id2, batch.StatusFailed, 30*time.Second)
	_, err = admin.Exec(ctx, `DROP TRIGGER fail_publication ON curated.fleet_publications`)
	require.NoError(t, err)
	out, code := runEnqueue(t, enqueueURL, "resume", "--batch-id", itoa(id2), "--tenant-id", "tenant-a", "--folder", other)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "permission denied", "the door's role resumes nothing")
	require.Contains(t, out, "fleet_operator", "the error names the login to use")
	out, code = runEnqueue(t, operatorURL, "resume", "--batch-id", itoa(id2), "--tenant-id", "tenant-a", "--folder", other)
	require.Equal(t, 0, code, out)
	waitStatus(t, admin, id2, batch.StatusSucceeded, 30*time.Second)
	out, code = runEnqueue(t, enqueueURL, "status", "--batch-id", itoa(id2), "--json")
	require.Equal(t, 0, code, out)

	// Cancel and retry as the operator role (the worker role parks); the
	// door's role may do neither.
	cancelled := writeFolder(t, sample)
	blocked := blockLoads(t, admin)
	id3 := enqueueBatch(t, enqueueURL, "tenant-a", cancelled)
	waitLoadBlocked(t, admin, id3, "w")
	out, code = runEnqueue(t, enqueueURL, "cancel", "--batch-id", itoa(id3), "--tenant-id", "tenant-a", "--reason", "least privilege")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "permission denied", "the door's role cancels nothing")
	out, code = runEnqueue(t, operatorURL, "cancel", "--batch-id", itoa(id3), "--tenant-id", "tenant-a", "--reason", "least privilege")
	require.Equal(t, 0, code, out)
	require.Equal(t, "cancelled", outcome(t, out)["outcome"])
	blocked()
	out, code = runEnqueue(t, operatorURL, "retry", "--batch-id", itoa(id3), "--tenant-id", "tenant-a")
	require.Equal(t, 0, code, out)
	retried := int64(outcome(t, out)["batch_id"].(float64))
	waitStatus(t, admin, retried, batch.StatusSucceeded, 30*time.Second)

	// enqueue serve as the enqueue role: an import the worker completes,
	// and a signed notification accepted once across two replicas. Its
	// operator surfaces act as the operator role: the cancel route cancels
	// and the River UI reads River's tables.
	secretFile := filepath.Join(t.TempDir(), "hmac")
	require.NoError(t, os.WriteFile(secretFile, []byte("roles-secret"), 0o600))
	serveArgs := []string{"--hmac-secret-file", secretFile, "--dev-allow-local-folders"}
	serveA, baseA := startServe(t, enqueueURL, []string{"ENQUEUE_AUTH_TOKEN=tok", "ENQUEUE_OPERATOR_TOKEN=op-tok", "OPERATOR_DATABASE_URL=" + operatorURL}, serveArgs...)
	serveB, baseB := startServe(t, enqueueURL, []string{"ENQUEUE_AUTH_TOKEN=tok", "ENQUEUE_OPERATOR_TOKEN=op-tok"}, serveArgs...)
	require.NotContains(t, serveA.logs.String(), "may not cancel batches")
	serveB.waitLog("the operator surfaces' database login may not cancel batches", 10*time.Second)
	third := writeFolder(t, sample)
	status, body := postJSON(t, baseA+"/v1/imports", "tok", map[string]any{"tenant_id": "tenant-b", "tenant_database": "db", "company_id": "c", "folder": third})
	require.Equal(t, http.StatusAccepted, status, body)
	waitStatus(t, admin, int64(body["batch_id"].(float64)), batch.StatusSucceeded, 30*time.Second)
	event := s3EventBody("fleet-uploads", "tenants/tenant-c/db/c/roles/_SUCCESS")
	sig, ts := uploads.Sign([]byte("roles-secret"), event, time.Now())
	status, _ = postSigned(t, baseA, event, sig, ts)
	require.Equal(t, http.StatusAccepted, status)
	status, _ = postSigned(t, baseB, event, sig, ts)
	require.Equal(t, http.StatusUnauthorized, status, "the replay is refused by the other replica")

	blocked = blockLoads(t, admin)
	id4 := enqueueBatch(t, enqueueURL, "tenant-a", writeFolder(t, sample))
	waitLoadBlocked(t, admin, id4, "w")
	opAdmin := "http://" + adminAddr(t, serveA)
	status, body = postJSON(t, opAdmin+"/v1/batches/"+itoa(id4)+"/cancel", "op-tok", map[string]any{"tenant_id": "tenant-a", "reason": "as the operator login"})
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "cancelled", body["outcome"])
	blocked()
	waitStatus(t, admin, id4, batch.StatusFailed, 30*time.Second)
	req, err := http.NewRequest(http.MethodGet, opAdmin+"/riverui/api/jobs?state=completed&limit=100", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer op-tok")
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "the River UI reads as the operator role: %s", page)
	require.Contains(t, string(page), `"kind":"fleet_ingest"`)

	// The worker role's sweeper records its sweeps (ingest_sweeps), so the
	// fleet sweeps once per period: a missing grant would fail every sweep.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM ingest_sweeps WHERE swept_at > now() - interval '10 seconds'`).Scan(&n))
		return n == 1
	}, 15*time.Second, 100*time.Millisecond, "the worker (as fleet_worker) never recorded a sweep")

	// What the roles may not do.
	w := pgtest.Pool(t, workerURL)
	e := pgtest.Pool(t, enqueueURL)
	o := pgtest.Pool(t, operatorURL)
	for _, sql := range []string{
		`CREATE TABLE sneaky (i int)`,
		`CREATE TABLE curated.sneaky (i int)`,
		`CREATE TEMP TABLE sneaky (i int)`,
		`ALTER TABLE ingestion_batches ADD COLUMN x int`,
		`INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status) VALUES ('c','t','d','Api','BrinkPos','s','Running')`,
		`DELETE FROM ingestion_batches`,
		`TRUNCATE curated.fleet_records`,
		`DROP TABLE river_job`,
		`DELETE FROM ingest_seen_signatures`,
	} {
		requirePermissionDenied(t, w, sql)
	}
	for _, sql := range []string{
		`CREATE TABLE sneaky (i int)`,
		`CREATE TEMP TABLE sneaky (i int)`,
		`DELETE FROM ingestion_batches`,
		`DELETE FROM river_job`,
		`INSERT INTO curated.fleet_records (tenant_id, source_scope, batch_id, object_key, line_number, record) VALUES ('t','s',1,'k',1,'{}')`,
		`UPDATE curated.fleet_slices SET published_at = now()`,
		`SELECT count(*) FROM curated.fleet_records`,
		`UPDATE river_job SET state = 'cancelled'`,
	} {
		requirePermissionDenied(t, e, sql)
	}
	for _, sql := range []string{
		`CREATE TABLE sneaky (i int)`,
		`CREATE TEMP TABLE sneaky (i int)`,
		`INSERT INTO curated.fleet_records (tenant_id, source_scope, batch_id, object_key, line_number, record) VALUES ('t','s',1,'k',1,'{}')`,
		`UPDATE ingest_sweeps SET swept_at = now()`,
		`DELETE FROM ingest_seen_signatures`,
	} {
		requirePermissionDenied(t, o, sql)
	}
	// No role can change what a batch is for, whatever its status.
	for _, role := range []*pgxpool.Pool{w, e, o} {
		for _, set := range []string{
			`tenant_id = 'evil'`, `source_scope = 'fleet_s3:s3://evil/x'`, `company_id = 'evil'`,
			`tenant_database = 'evil'`, `source_type = 'KdsCdc'`, `ingestion_mode = 'Api'`, `pipeline_stage = 'x'`,
			`business_date = current_date`, `is_current = true`, `started_at = now()`, `created_at = now()`,
		} {
			requireDenied(t, role, "permission denied", `UPDATE ingestion_batches SET `+set+` WHERE id = $1`, id)
		}
	}
	// The door changes no batch but a tenant's cancel of one no delivery
	// holds (issue 45: a Succeeded batch is hidden from its updates); the
	// operator only ever sets Running or Failed, and never touches a
	// Succeeded batch: neither declares or undoes success, by update or by
	// insert.
	tag, err := e.Exec(ctx, `UPDATE ingestion_batches SET status = 'Failed' WHERE id = $1`, id2)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "a Succeeded batch is hidden from the door's updates")
	requireDenied(t, o, "row-level security", `UPDATE ingestion_batches SET status = 'Succeeded' WHERE id = $1`, id3)
	requireDenied(t, o, "row-level security", `UPDATE ingestion_batches SET status = 'Succeeded', details = details WHERE status <> 'Succeeded'`)
	tag, err = o.Exec(ctx, `UPDATE ingestion_batches SET status = 'Failed', completed_at = now() WHERE id = $1`, id2)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "a Succeeded batch is hidden from the operator's updates")
	// The operator prunes history (enqueue prune): row-level security lets
	// only old terminal batches that are not their folder's newest go.
	tag, err = o.Exec(ctx, `DELETE FROM ingestion_batches`)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "no batch of this run is old enough to prune")
	requireDenied(t, e, "row-level security", `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, business_date, pipeline_stage, status, details, source_scope)
		VALUES ('c', 't', 'd', 'FileUpload', 'FleetS3', NULL, 'fleet_s3_direct_to_curated', 'Succeeded', '{}', 'fleet_s3:s3://b/x')`)
	requireDenied(t, e, "permission denied", `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, execution_lease_id, execution_lease_expires_at)
		VALUES ('c', 't', 'd', 'FileUpload', 'FleetS3', 'x', 'Running', 'mine', now() + interval '1 day')`)
	var succeeded int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches WHERE status = 'Succeeded'`).Scan(&succeeded))
	require.Equal(t, 4, succeeded, "only the worker's four batches succeeded (import, resume, retry, HTTP import)")

	// Another role on the same server cannot open a session here.
	stranger := fmt.Sprintf("e2e_stranger_%d_%d", os.Getpid(), roleSeq.Add(1))
	_, err = admin.Exec(ctx, `CREATE ROLE `+stranger+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP ROLE IF EXISTS `+stranger) })
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(stranger)
	conn, err := pgx.Connect(ctx, u.String())
	if err == nil {
		conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "a stranger connects: %v", err)
	require.Equal(t, "42501", pgErr.Code)

	// "worker migrate" as the worker role cannot create anything.
	fresh := pgtest.NewDatabaseURLAt(t, 1)
	freshAdmin := pgtest.Pool(t, fresh)
	_, err = freshAdmin.Exec(ctx, `REVOKE CREATE ON SCHEMA public FROM PUBLIC; GRANT USAGE ON SCHEMA public TO fleet_worker`)
	require.NoError(t, err)
	cmdOut, code := runWorkerCommand(t, loginAs(t, freshAdmin, fresh, "fleet_worker"), "migrate")
	require.Equal(t, 1, code, cmdOut)
	require.True(t, strings.Contains(cmdOut, "permission denied"), cmdOut)
}

// postSigned posts an S3 event signed with the HMAC headers, no token.
func postSigned(t *testing.T, base string, body []byte, sig, ts string) (int, map[string]any) {
	t.Helper()
	req, err := newRequest(base+"/v1/events/s3", string(body))
	require.NoError(t, err)
	req.Header.Set(uploads.SignatureHeader, sig)
	req.Header.Set(uploads.TimestampHeader, ts)
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestTenantIsolation: a resume or status request naming another tenant's
// batch is refused as not found.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	folderURL := writeFolder(t, sample)
	id := enqueueBatch(t, dbURL, "tenant-a", folderURL)

	out, code := runEnqueue(t, dbURL, "status", "--batch-id", itoa(id), "--tenant-id", "tenant-b", "--json")
	require.Equal(t, 5, code)
	require.Equal(t, "not_found", outcome(t, out)["outcome"])
	require.NotContains(t, out, "tenant-a", "nothing of the other tenant's batch is shown")
	out, code = runEnqueue(t, dbURL, "status", "--batch-id", itoa(id), "--tenant-id", "tenant-a", "--json")
	require.Equal(t, 0, code, out)
	out, code = runEnqueue(t, dbURL, "resume", "--batch-id", itoa(id), "--tenant-id", "tenant-b", "--folder", folderURL)
	require.Equal(t, 5, code)
	require.Equal(t, "not_found", outcome(t, out)["outcome"])
	out, code = runEnqueue(t, dbURL, "list", "--tenant-id", "tenant-b", "--json")
	require.Equal(t, 0, code)
	require.Empty(t, strings.TrimSpace(out))
}

// TestHostileInputRefusedAndNothingWritten sends hostile values through the
// command line and the HTTP listener.
func TestHostileInputRefusedAndNothingWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	folderURL := writeFolder(t, sample)

	// SQL metacharacters are data, never SQL: a folder segment may hold
	// them (S3 allows ' ( ) ; and spaces); a tenant id may not (its
	// allow-list), which is refused before anything is written.
	sneaky := `x'); DROP TABLE ingestion_batches; --`
	sneakyFolder := folderURL + "/" + sneaky
	require.NoError(t, os.MkdirAll(strings.TrimPrefix(sneakyFolder, "file://"), 0o755))
	require.NoError(t, os.WriteFile(strings.TrimPrefix(sneakyFolder, "file://")+"/a.csv", []byte("k,v\n1,a\n"), 0o644))
	out, code := runEnqueue(t, dbURL, importArgs("tenant-a", sneakyFolder)...)
	require.Equal(t, 0, code, out)
	id := int64(outcome(t, out)["batch_id"].(float64))
	b, _ := getBatch(t, pool, id)
	require.Equal(t, "fleet_s3:"+sneakyFolder, b.Scope())
	out, code = runEnqueue(t, dbURL, importArgs(sneaky, folderURL)...)
	require.Equal(t, 2, code, out)
	require.Equal(t, "tenant_id", outcome(t, out)["field"])

	count := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&n))
		return n
	}
	refused := [][]string{
		importArgs(strings.Repeat("t", 10_000), folderURL),
		importArgs("tenant-a", "s3://bucket/"+strings.Repeat("a", 100_000)),
		importArgs("tenant\xff", folderURL),
		importArgs("tenant-a", "s3://bucket/a/../../etc"),
		importArgs("tenant-a", "file:///etc/../root"),
		importArgs("tenant-a", "s3://bucket/a\x1b[31m"),
		importArgs("tenant-a", "s3://bucket/a?x=$(id)"),
		{"import", "--tenant-id", "t", "--tenant-database", "../../etc/passwd", "--company-id", "c", "--folder", folderURL},
		{"import", "--tenant-id", "t", "--tenant-database", "db", "--company-id", "c\u2028\u0085", "--folder", folderURL},
		{"resume", "--batch-id", "-1", "--tenant-id", "t", "--folder", folderURL},
		{"resume", "--batch-id", "99999999999999999999999", "--tenant-id", "t", "--folder", folderURL},
	}
	for _, args := range refused {
		out, code := runEnqueue(t, dbURL, args...)
		require.Equal(t, 2, code, "%q: %s", args, out)
	}
	require.Equal(t, 1, count(), "refused input writes nothing")

	_, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok"})
	post := func(path, body string) int {
		req, err := newRequest(base+path, body)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	for name, tc := range map[string]struct {
		path, body string
		status     int
	}{
		"NUL in tenant":        {"/v1/imports", `{"tenant_id":"a\u0000b","tenant_database":"db","company_id":"c","folder":"s3://bucket/x"}`, 422},
		"NUL in folder":        {"/v1/imports", `{"tenant_id":"a","tenant_database":"db","company_id":"c","folder":"s3://bucket/x\u0000"}`, 422},
		"traversal in folder":  {"/v1/imports", `{"tenant_id":"a","tenant_database":"db","company_id":"c","folder":"s3://bucket/x/../../y"}`, 422},
		"huge JSON":            {"/v1/imports", `{"tenant_id":"` + strings.Repeat("a", 2<<20) + `"}`, 413},
		"deeply nested JSON":   {"/v1/imports", strings.Repeat("[", 100_000), 400},
		"wrong types":          {"/v1/imports", `{"tenant_id":1,"tenant_database":[],"company_id":{},"folder":null}`, 400},
		"traversal in S3 key":  {"/v1/events/s3", string(s3EventBody("fleet", "tenants/t/db/c/../../../etc/_SUCCESS")), 422},
		"NUL in S3 key":        {"/v1/events/s3", string(s3EventBody("fleet", "tenants/t/db/c/x%00/_SUCCESS")), 422},
		"invalid UTF-8 escape": {"/v1/events/s3", string(s3EventBody("fleet", "tenants/t/db/c/%ff/_SUCCESS")), 422},
	} {
		require.Equal(t, tc.status, post(tc.path, tc.body), name)
	}
	require.Equal(t, 1, count(), "refused requests write nothing")
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'ingestion_batches'`).Scan(&tables))
	require.Equal(t, 1, tables)
}

// TestSecretsNeverLeak runs the processes with a database password, an
// import token and an operator token, and greps their logs, error output
// and /metrics for them.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	const password, token, operator = "pw-Zq9-never-print", "tok-Xr7-never-print", "op-Kw4-never-print"
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), password) // trust auth: accepted, never needed
	withPassword := u.String()

	w := startWorker(t, withPassword, append([]string{"--log-level", "debug"}, fastLease...)...)
	serve, base := startServe(t, withPassword, []string{"ENQUEUE_AUTH_TOKEN=" + token, "ENQUEUE_OPERATOR_TOKEN=" + operator, "LOG_LEVEL=debug"}, "--dev-allow-local-folders")
	folderURL := writeFolder(t, sample)
	status, body := postJSON(t, base+"/v1/imports", token, map[string]any{"tenant_id": "t", "tenant_database": "db", "company_id": "c", "folder": folderURL})
	require.Equal(t, 202, status, body)
	waitStatus(t, pool, int64(body["batch_id"].(float64)), batch.StatusSucceeded, 30*time.Second)
	status, _ = postJSON(t, base+"/v1/imports", "wrong-"+token, map[string]any{"tenant_id": "t"})
	require.Equal(t, 401, status)
	admin := "http://" + adminAddr(t, serve)
	status, _ = postJSON(t, admin+"/v1/batches/1/cancel", token, map[string]any{"tenant_id": "t"})
	require.Equal(t, 403, status, "refused operator requests log no token")
	status, _ = postJSON(t, admin+"/v1/batches/1/cancel", operator+"-wrong", map[string]any{"tenant_id": "t"})
	require.Equal(t, 401, status)

	bad := strings.Replace(withPassword, u.Host, "127.0.0.1:1", 1) + "&connect_timeout=1"
	errOut, code := runEnqueue(t, bad, importArgs("t", folderURL)...)
	require.Equal(t, 1, code)
	workerErr, code := runWorkerCommand(t, bad, "migrate")
	require.Equal(t, 1, code)

	for name, text := range map[string]string{
		"worker logs":    w.logs.String(),
		"worker metrics": httpGet(t, "http://"+w.addr+"/metrics"),
		"serve logs":     serve.logs.String(),
		"serve metrics":  httpGet(t, base+"/metrics"),
		"enqueue error":  errOut,
		"migrate error":  workerErr,
	} {
		require.NotContains(t, text, password, name)
		require.NotContains(t, text, token, name)
		require.NotContains(t, text, operator, name)
	}
	require.Contains(t, w.logs.String(), "xxxxx", "the password is shown masked")
}
