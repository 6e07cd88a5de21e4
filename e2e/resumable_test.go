package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

// seedFailedPublication records, as the worker leaves one, a batch of
// folderURL that committed its load and then failed its publication: a
// batch an operator can resume. It returns the batch id and its scope.
func seedFailedPublication(t *testing.T, pool *pgxpool.Pool, tenant, database, company, folderURL string) (int64, string) {
	t.Helper()
	f, err := folder.Canonicalize(folderURL)
	require.NoError(t, err)
	d := batch.NewDetails(f.String())
	committed := time.Now().Add(-time.Minute).UTC()
	d.Phase, d.RedshiftCommitted, d.CommittedAt, d.RecordCount = batch.PhaseFailedPublication, true, &committed, 5
	d.Publication.Started = true
	d.LastError = &batch.ErrorRecord{Phase: batch.PhaseFailedPublication, Message: "publication outbox refused the slice (seeded)", At: committed}
	raw, err := d.Marshal()
	require.NoError(t, err)
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
		                               pipeline_stage, status, details, source_scope, completed_at)
		VALUES ($1, $2, $3, $4, $5, $6, 'Failed', $7, $8, now()) RETURNING id`,
		company, tenant, database, batch.IngestionModeFileUpload, batch.SourceTypeFleetS3,
		batch.PipelineStageFleet, string(raw), f.Scope()).Scan(&id))
	return id, f.Scope()
}

// TestEveryDoorAnswersAResumableFolderWithItsBatch: a folder whose newest
// batch committed its load and failed its publication is resumed, never
// loaded a second time. An import of it through the command line, the
// HTTP door, an S3 event and an SQS message each answers resumable naming
// that batch, the rule enqueue retry applies, and nothing is reserved or
// enqueued. Before, each of them reserved a new batch (a second load of
// the same data, whose commit would leave the first unresumable).
func TestEveryDoorAnswersAResumableFolderWithItsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	const tenant, database, company = "acme", "db_acme", "company-1"
	key := func(n int) string { return fmt.Sprintf("tenants/%s/%s/%s/upload-%04d", tenant, database, company, n) }
	folderOf := func(n int) string { return "s3://" + sqsBucket + "/" + key(n) }
	failed := map[int]int64{}
	scopes := map[int]string{}
	for n := 1; n <= 4; n++ {
		failed[n], scopes[n] = seedFailedPublication(t, pool, tenant, database, company, folderOf(n))
	}
	nothingNew := func(n int) {
		t.Helper()
		var batches, jobs int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches WHERE source_scope = $1`, scopes[n]).Scan(&batches))
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job`).Scan(&jobs))
		require.Equal(t, 1, batches, "folder %d: no new batch", n)
		require.Zero(t, jobs, "no job was enqueued")
		b, d := getBatch(t, pool, failed[n])
		require.Equal(t, batch.StatusFailed, b.Status)
		require.Equal(t, batch.PhaseFailedPublication, d.Phase, "the failed batch is left as it was: resumable")
	}

	// The command line: exit 7, the batch named.
	out, code := runEnqueue(t, dbURL, "import", "--tenant-id", tenant, "--tenant-database", database, "--company-id", company, "--folder", folderOf(1))
	require.Equal(t, 7, code, out)
	o := outcome(t, out)
	require.Equal(t, "resumable", o["outcome"], o)
	require.Equal(t, float64(failed[1]), o["batch_id"])
	require.Equal(t, "failed_publication", o["phase"])
	require.Equal(t, "failed_publication_resume_instead", o["reason"])
	nothingNew(1)

	// The HTTP door: 409, the same answer.
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("door-token\n"), 0o600))
	serve, base := startServe(t, dbURL, nil, "--auth-token-file", tokenFile)
	status, body := postJSON(t, base+"/v1/imports", "door-token", map[string]any{"folder": folderOf(2)})
	require.Equal(t, http.StatusConflict, status, body)
	require.Equal(t, "resumable", body["outcome"], body)
	require.Equal(t, float64(failed[2]), body["batch_id"])
	nothingNew(2)

	// An S3 event of the folder's marker: the record answers resumable.
	req, err := newRequest(base+"/v1/events/s3", string(s3EventBody(sqsBucket, key(3)+"/_SUCCESS")))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer door-token")
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	nothingNew(3)
	require.Equal(t, 2.0, serve.metric(`ingest_reservations_total{outcome="resumable",source_type="FleetS3"}`))

	// SQS: the message is done (deleted), nothing reserved.
	srv := sqstest.Start(t)
	queue := srv.CreateQueue(t, "uploads", map[string]string{"VisibilityTimeout": "30"})
	c := startSQSConsumer(t, "sqs", dbURL, srv, queue)
	srv.Send(t, queue, sqstest.S3Event(sqsBucket, key(4)+"/_SUCCESS"))
	waitDrained(t, srv, queue, 60*time.Second)
	nothingNew(4)
	require.Equal(t, 1.0, c.metric(`ingest_reservations_total{outcome="resumable",source_type="FleetS3"}`))
	require.Zero(t, c.metric(`ingest_reservations_total{outcome="reserved",source_type="FleetS3"}`))
}
