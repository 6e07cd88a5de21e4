package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/uploads"
)

// auditEntries runs enqueue audit --json as dbURL's login and returns its
// entries, newest first.
func auditEntries(t *testing.T, dbURL string) []audit.Entry {
	t.Helper()
	out, code := runEnqueue(t, dbURL, "audit", "--json", "--since", "1h")
	require.Equal(t, 0, code, out)
	var entries []audit.Entry
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e audit.Entry
		require.NoError(t, json.Unmarshal([]byte(line), &e), line)
		entries = append(entries, e)
	}
	return entries
}

// findEntry returns the only entry of action in entries.
func findEntry(t *testing.T, entries []audit.Entry, action string) audit.Entry {
	t.Helper()
	var found []audit.Entry
	for _, e := range entries {
		if e.Action == action {
			found = append(found, e)
		}
	}
	require.Len(t, found, 1, "one %s in %+v", action, entries)
	return found[0]
}

// operatorTokensFile writes an operator tokens file of the operators'
// tokens (name → token) and returns its path.
func operatorTokensFile(t *testing.T, dir string, tokens ...[2]string) string {
	t.Helper()
	path := filepath.Join(dir, "operator-tokens")
	writeOperatorTokens(t, path, tokens...)
	return path
}

// writeOperatorTokens replaces the file at path with the lines of tokens
// (name, token), as a Secret's update does: a new file renamed over it.
func writeOperatorTokens(t *testing.T, path string, tokens ...[2]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# operator tokens\n")
	for _, nt := range tokens {
		b.WriteString(uploads.OperatorTokenLine(nt[0], nt[1]) + "\n")
	}
	tmp := path + ".new"
	require.NoError(t, os.WriteFile(tmp, []byte(b.String()), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// TestAuditListsOperatorActionsWithTheirActors: with roles.sql applied,
// enqueue serve's operator surfaces on the operators' login and an
// operator tokens file naming alice:
//   - a cancel through the admin route with alice's token (and a header
//     claiming to be mallory) is recorded as by alice, through http, with
//     its reason; mallory is only in the note;
//   - a retry from the command line, as an operator login, with --by bob,
//     is recorded as by that login (the credential), bob in the note;
//   - a prune --apply is recorded with the ids it deleted and its reason;
//   - a queue paused through the River UI with alice's token as the Basic
//     password and "eve" as its user is recorded as by alice, eve in the
//     note;
//
// enqueue audit --json lists all four, newest first, each with the
// database login that wrote it; and the operators' login can neither
// change nor delete a row.
func TestAuditListsOperatorActionsWithTheirActors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	applyRoles(t, admin)
	serveOperatorURL := loginAs(t, admin, dbURL, "fleet_operator")
	cliOperatorURL := loginAs(t, admin, dbURL, "fleet_operator")
	cliLogin := loginName(t, cliOperatorURL)
	serveLogin := loginName(t, serveOperatorURL)

	tokens := operatorTokensFile(t, t.TempDir(), [2]string{"alice", "alice-s3cr3t"})
	serve, public := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=import-tok"},
		"--operator-token-file", tokens, "--operator-database-url", serveOperatorURL, "--dev-allow-local-folders")
	adminURL := "http://" + adminAddr(t, serve)

	// A cancel through the admin route.
	status, out := postJSON(t, public+"/v1/imports", "import-tok",
		map[string]any{"tenant_id": "tenant-a", "tenant_database": "db", "company_id": "c", "folder": writeFolder(t, sample)})
	require.Equal(t, http.StatusAccepted, status, "%v", out)
	cancelled := int64(out["batch_id"].(float64))
	status, out = postWith(t, fmt.Sprintf("%s/v1/batches/%d/cancel", adminURL, cancelled),
		map[string]string{"Authorization": "Bearer alice-s3cr3t", uploads.OperatorHeader: "mallory"},
		map[string]any{"tenant_id": "tenant-a", "reason": "wrong upload"})
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.Equal(t, "cancelled", out["outcome"])
	b, _ := getBatch(t, admin, cancelled)
	require.NotNil(t, b.CancelledBy)
	require.True(t, strings.HasPrefix(*b.CancelledBy, "http:alice@"), *b.CancelledBy)

	// A retry from the command line, as an operator login.
	out2, code := runEnqueue(t, cliOperatorURL, "retry", "--batch-id", itoa(cancelled), "--tenant-id", "tenant-a", "--by", "bob", "--reason", "re-uploaded")
	require.Equal(t, 0, code, out2)
	retried := outcome(t, out2)
	require.Equal(t, "enqueued", retried["outcome"])

	// A prune: two old Succeeded batches of a folder, the older prunable.
	old := func(days int) int64 {
		folder := "s3://fleet-uploads/tenants/t-p/db/c/up-1/"
		d := batch.NewDetails(folder)
		d.Phase, d.RedshiftCommitted = batch.PhasePublished, true
		raw, err := d.Marshal()
		require.NoError(t, err)
		var id int64
		require.NoError(t, admin.QueryRow(ctx, `
			INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope, completed_at)
			VALUES ('c', 't-p', 'db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', 'Succeeded', $1, $2, now() - $3 * interval '1 day')
			RETURNING id`, string(raw), "fleet_s3:"+folder, days).Scan(&id))
		return id
	}
	pruned, kept := old(3), old(2)
	out2, code = runEnqueue(t, cliOperatorURL, "prune", "--older-than", "1d", "--apply", "--reason", "retention", "--by", "carol")
	require.Equal(t, 0, code, out2)
	require.Equal(t, float64(1), outcome(t, out2)["batches"], out2)
	var left int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches WHERE id IN ($1, $2)`, pruned, kept).Scan(&left))
	require.Equal(t, 1, left)

	// A queue paused through the River UI.
	_, err := admin.Exec(ctx, `INSERT INTO river_queue (name, created_at, metadata, updated_at) VALUES ('fleet_ingest', now(), '{}', now()) ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPut, adminURL+"/riverui/api/queues/fleet_ingest/pause", strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.SetBasicAuth("eve", "alice-s3cr3t")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	var paused bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT paused_at IS NOT NULL FROM river_queue WHERE name = 'fleet_ingest'`).Scan(&paused))
	require.True(t, paused)

	// enqueue audit --json, as an operator login.
	entries := auditEntries(t, cliOperatorURL)
	require.Len(t, entries, 4, "%+v", entries)
	require.Equal(t, []string{audit.ActionQueuePause, audit.ActionPrune, audit.ActionRetry, audit.ActionCancel},
		[]string{entries[0].Action, entries[1].Action, entries[2].Action, entries[3].Action}, "newest first")

	c := findEntry(t, entries, audit.ActionCancel)
	require.Equal(t, "alice", c.Actor, "who comes from the token")
	require.Equal(t, audit.DoorHTTP, c.Door)
	require.Equal(t, serveLogin, c.Login)
	require.Equal(t, "cancelled", c.Outcome)
	require.Equal(t, cancelled, c.BatchID)
	require.Equal(t, "tenant-a", c.TenantID)
	require.Equal(t, "wrong upload", c.Reason)
	require.Contains(t, c.Note, "says mallory", "the header is a note")
	require.NotContains(t, c.Actor, "mallory")

	r := findEntry(t, entries, audit.ActionRetry)
	require.Equal(t, cliLogin, r.Actor, "a command's actor is its database login")
	require.Equal(t, cliLogin, r.Login)
	require.Equal(t, audit.DoorCLI, r.Door)
	require.Equal(t, "enqueued", r.Outcome)
	require.Equal(t, cancelled, r.BatchID)
	require.Equal(t, "re-uploaded", r.Reason)
	require.Contains(t, r.Note, "says bob")
	require.Contains(t, r.Note, "os user ")
	var rd map[string]any
	require.NoError(t, json.Unmarshal(r.Details, &rd))
	require.Equal(t, retried["batch_id"], rd["batch_id"], "the new batch")
	require.Equal(t, float64(cancelled), rd["retry_of"])

	p := findEntry(t, entries, audit.ActionPrune)
	require.Equal(t, cliLogin, p.Actor)
	require.Equal(t, "retention", p.Reason)
	require.Contains(t, p.Note, "says carol")
	var pd struct {
		BatchIDs []int64 `json:"batch_ids"`
	}
	require.NoError(t, json.Unmarshal(p.Details, &pd))
	require.Equal(t, []int64{pruned}, pd.BatchIDs)

	q := findEntry(t, entries, audit.ActionQueuePause)
	require.Equal(t, "alice", q.Actor, "the River UI's Basic user is no identity")
	require.Equal(t, audit.DoorRiverUI, q.Door)
	require.Equal(t, serveLogin, q.Login)
	require.Equal(t, "fleet_ingest", q.Queue)
	require.Equal(t, "done", q.Outcome)
	require.Contains(t, q.Note, "says eve")

	// The table (not JSON) names them too.
	text, code := runEnqueue(t, cliOperatorURL, "audit")
	require.Equal(t, 0, code, text)
	require.Regexp(t, `(?m)^\d+\s+\S+\s+alice\s+http\s+`+serveLogin+`\s+cancel\s+cancelled\s+`+itoa(cancelled)+`\s`, text)

	// Append-only, for the login that writes it.
	operator := pgtest.Pool(t, cliOperatorURL)
	requirePermissionDenied(t, operator, `UPDATE ingest_operator_actions SET actor = 'someone else'`)
	requirePermissionDenied(t, operator, `DELETE FROM ingest_operator_actions`)
	require.Len(t, auditEntries(t, cliOperatorURL), 4)
}

// TestOperatorTokensRotateWithoutRestart: two operator tokens in the file,
// both cancel; the old line removed, within the reload interval only the
// new one does (the old is 401), with no restart; the actions are recorded
// under each token's operator.
func TestOperatorTokensRotateWithoutRestart(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	tokens := operatorTokensFile(t, t.TempDir(), [2]string{"alice", "alice-old"}, [2]string{"alice-2026", "alice-new"})
	serve, public := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=import-tok"},
		"--operator-token-file", tokens, "--operator-tokens-reload", "1s", "--dev-allow-local-folders")
	adminURL := "http://" + adminAddr(t, serve)
	cancel := func(token string) (int, map[string]any) {
		status, out := postJSON(t, public+"/v1/imports", "import-tok",
			map[string]any{"tenant_id": "tenant-r", "tenant_database": "db", "company_id": "c", "folder": writeFolder(t, sample)})
		require.Equal(t, http.StatusAccepted, status, "%v", out)
		return postJSON(t, fmt.Sprintf("%s/v1/batches/%d/cancel", adminURL, int64(out["batch_id"].(float64))), token,
			map[string]any{"tenant_id": "tenant-r"})
	}
	for _, token := range []string{"alice-old", "alice-new"} {
		status, out := cancel(token)
		require.Equal(t, http.StatusOK, status, "%s: %v", token, out)
	}

	writeOperatorTokens(t, tokens, [2]string{"alice-2026", "alice-new"})
	start := time.Now()
	require.Eventually(t, func() bool {
		status, _ := cancel("alice-old")
		return status == http.StatusUnauthorized
	}, 30*time.Second, 200*time.Millisecond, "the removed token stops working")
	t.Logf("old operator token refused %s after its line was removed (reload every 1s)", time.Since(start).Round(100*time.Millisecond))
	status, out := cancel("alice-new")
	require.Equal(t, http.StatusOK, status, "the new token still works: %v", out)

	// A token pasted instead of its hash: that line is refused and counted,
	// the others still apply.
	require.NoError(t, os.WriteFile(tokens+".new", []byte(uploads.OperatorTokenLine("alice-2026", "alice-new")+"\nbob bobs-raw-token\n"), 0o600))
	require.NoError(t, os.Rename(tokens+".new", tokens))
	require.Eventually(t, func() bool {
		return strings.Contains(httpGet(t, adminURL+"/metrics"), `ingest_secret_file_reload_failures_total{file="operator_token_file"} `) &&
			!strings.Contains(httpGet(t, adminURL+"/metrics"), `ingest_secret_file_reload_failures_total{file="operator_token_file"} 0`)
	}, 30*time.Second, 200*time.Millisecond, "the malformed line is counted")
	require.Contains(t, serve.waitLog(`"msg":"reloading operator tokens: refused what is wrong, applied the rest"`, 10*time.Second), "line 2")
	require.NotContains(t, serve.logs.String(), "bobs-raw-token", "never the line's content")
	status, out = cancel("alice-new")
	require.Equal(t, http.StatusOK, status, "the valid line still applies: %v", out)

	var actors []string
	rows, err := pool.Query(context.Background(), `SELECT actor FROM ingest_operator_actions WHERE outcome = 'cancelled' ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var a string
		require.NoError(t, rows.Scan(&a))
		actors = append(actors, a)
	}
	require.NoError(t, rows.Err())
	// alice's old token may have cancelled a batch or two more before the
	// reload: each under its own operator.
	require.GreaterOrEqual(t, len(actors), 3)
	require.Equal(t, []string{"alice", "alice-2026"}, actors[:2])
	require.Equal(t, "alice-2026", actors[len(actors)-1])
	for _, a := range actors {
		require.Contains(t, []string{"alice", "alice-2026"}, a)
	}
}

// postWith posts body as JSON to url with headers and decodes the answer.
func postWith(t *testing.T, url string, headers map[string]string, body any) (int, map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(b)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// loginName is the login of dbURL.
func loginName(t *testing.T, dbURL string) string {
	t.Helper()
	login, err := audit.CurrentLogin(context.Background(), pgtest.Pool(t, dbURL))
	require.NoError(t, err)
	return login
}
