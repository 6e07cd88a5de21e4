package fleet_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
)

// s3srv serves every s3:// folder of this package's tests; TestMain points
// the AWS SDK at it through AWS_ENDPOINT_URL_S3, as a deployment points it
// at S3.
var s3srv *s3test.Server

func TestMain(m *testing.M) {
	s3srv = s3test.New()
	s3srv.SetEnv()
	code := m.Run()
	s3srv.Close()
	os.Exit(code)
}

// TestS3MissingBucketFailsPreCommit: a folder in a bucket that does not
// exist fails the batch, terminally, before any warehouse work, and the
// recorded error names the bucket.
func TestS3MissingBucketFailsPreCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b := e.reserve("tenant-a", "s3://no-such-fleet-bucket/tenants/tenant-a/tenant_db/company-1/upload")
	res := e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.Failed, res.Outcome, "%v", res.Err)
	require.Equal(t, batch.PhaseFailedPreCommit, res.Phase)
	got, d := e.details(b.ID)
	require.Equal(t, batch.StatusFailed, got.Status)
	require.NotNil(t, d.LastError)
	require.Contains(t, d.LastError.Message, `bucket "no-such-fleet-bucket" does not exist`)
}

// TestS3ThrottlingIsRetriedNotFailed: S3 answering 503 SlowDown leaves the
// batch Running for a retry, which then succeeds.
func TestS3ThrottlingIsRetriedNotFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s3srv.CreateBucket(t, "fleet-throttled")
	for k, v := range sampleFiles {
		s3srv.Put(t, "fleet-throttled", "tenants/tenant-a/tenant_db/company-1/upload/"+k, []byte(v))
	}
	b := e.reserve("tenant-a", "s3://fleet-throttled/tenants/tenant-a/tenant_db/company-1/upload")
	s3srv.Throttle("fleet-throttled", 1_000)
	res := e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.Retry, res.Outcome, "%v", res.Err)
	got, _ := e.details(b.ID)
	require.Equal(t, batch.StatusRunning, got.Status)

	s3srv.Throttle("fleet-throttled", 0)
	res = e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	total, _, _ := e.sliceRecords("tenant-a", b.Scope())
	require.Equal(t, 5, total)
}

// TestS3ControlCharacterKeyFailsOnlyItsOwnBatch: a folder holding an
// object whose key has U+0001 (S3 accepts it; gocloud could not read it)
// fails its batch at listing time, terminally (failed_pre_commit), before
// any warehouse write, with a reason naming the key escaped; another
// tenant's folder of the same bucket loads.
func TestS3ControlCharacterKeyFailsOnlyItsOwnBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s3srv.CreateBucket(t, "fleet-ctl-keys")
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		for k, v := range sampleFiles {
			s3srv.Put(t, "fleet-ctl-keys", "tenants/"+tenant+"/tenant_db/company-1/upload/"+k, []byte(v))
		}
	}
	s3srv.Put(t, "fleet-ctl-keys", "tenants/tenant-a/tenant_db/company-1/upload/late\x01.csv", []byte("vehicle,km\nV9,90\n"))
	a := e.reserve("tenant-a", "s3://fleet-ctl-keys/tenants/tenant-a/tenant_db/company-1/upload")
	b := e.reserve("tenant-b", "s3://fleet-ctl-keys/tenants/tenant-b/tenant_db/company-1/upload")

	res := e.deliver(a.ID, e.pipeline)
	require.Equal(t, pipeline.Failed, res.Outcome, "%v", res.Err)
	require.Equal(t, batch.PhaseFailedPreCommit, res.Phase)
	got, d := e.details(a.ID)
	require.Equal(t, batch.StatusFailed, got.Status)
	require.False(t, d.RedshiftCommitted)
	require.NotNil(t, d.LastError)
	require.Contains(t, d.LastError.Message, `unreadable object key: "tenants/tenant-a/tenant_db/company-1/upload/late\x01.csv" holds a control character (U+0001)`)
	total, _, _ := e.sliceRecords("tenant-a", a.Scope())
	require.Zero(t, total, "nothing reached the warehouse")

	res = e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	total, _, _ = e.sliceRecords("tenant-b", b.Scope())
	require.Equal(t, 5, total)
}

// TestPipelineOnRedshift runs the Fleet pipeline with Redshift as the
// warehouse (the Data API double, staging in the S3 server): an s3://
// folder is loaded, published, and its staging removed. (A load whose
// client died is in the warehouse contract and the chaos scenario.)
func TestPipelineOnRedshift(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	s3srv.CreateBucket(t, "fleet-rs-source")
	s3srv.CreateBucket(t, "fleet-rs-staging")
	for k, v := range sampleFiles {
		s3srv.Put(t, "fleet-rs-source", "tenants/tenant-a/tenant_db/company-1/upload/"+k, []byte(v))
	}
	double := redshifttest.Start(t, redshifttest.Options{DatabaseURL: pgtest.EmptyDatabaseURL(t), S3: s3srv.Client(), Workgroup: "fleet", Database: "dev"})
	wh, err := redshift.New(redshift.Config{
		WorkgroupName: "fleet", Database: "dev", IAMRole: "arn:aws:iam::123456789012:role/fleet-copy",
		Staging: "s3://fleet-rs-staging/loads/", PollInterval: 5 * time.Millisecond, PollMax: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	}, double.Client(), s3srv.Client())
	require.NoError(t, err)
	_, err = wh.Migrate(ctx)
	require.NoError(t, err)
	p := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh, Logger: slog.New(slog.DiscardHandler)}

	b := e.reserve("tenant-a", "s3://fleet-rs-source/tenants/tenant-a/tenant_db/company-1/upload")
	res := e.deliver(b.ID, p)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	_, d := e.details(b.ID)
	require.True(t, d.RedshiftCommitted)
	require.Equal(t, int64(5), d.RecordCount)
	var records, pubs int
	require.NoError(t, double.Pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_records WHERE batch_id = $1`, b.ID).Scan(&records))
	require.NoError(t, double.Pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_publications WHERE batch_id = $1`, b.ID).Scan(&pubs))
	require.Equal(t, 5, records)
	require.Equal(t, 1, pubs)
	out, err := s3srv.Client().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("fleet-rs-staging")})
	require.NoError(t, err)
	require.Empty(t, out.Contents, "staging is removed once the commit is confirmed")
}
