package redshift_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

// liveEnv names the settings of the live test.
var liveEnv = []string{"REDSHIFT_TEST_WORKGROUP", "REDSHIFT_TEST_DATABASE", "REDSHIFT_TEST_IAM_ROLE", "REDSHIFT_TEST_STAGING"}

// TestLiveRedshiftServerless runs the Warehouse contract against a real
// Redshift Serverless workgroup: opt in by setting REDSHIFT_TEST_WORKGROUP,
// REDSHIFT_TEST_DATABASE, REDSHIFT_TEST_IAM_ROLE (the COPY role) and
// REDSHIFT_TEST_STAGING (s3://bucket/prefix/), with AWS credentials and
// AWS_REGION in the environment (REDSHIFT_TEST_SECRET_ARN optionally). It
// migrates schema curated there and leaves its test tenant's rows behind.
func TestLiveRedshiftServerless(t *testing.T) {
	var missing []string
	for _, k := range liveEnv {
		if os.Getenv(k) == "" {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Skipf("live Redshift test skipped: set %s (and AWS credentials, AWS_REGION) to run it against a Redshift Serverless workgroup; missing: %s",
			strings.Join(liveEnv, ", "), strings.Join(missing, ", "))
	}
	t.Parallel()
	ctx := context.Background()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	require.NoError(t, err)
	base := redshift.Config{
		WorkgroupName: os.Getenv("REDSHIFT_TEST_WORKGROUP"), Database: os.Getenv("REDSHIFT_TEST_DATABASE"),
		SecretARN: os.Getenv("REDSHIFT_TEST_SECRET_ARN"), IAMRole: os.Getenv("REDSHIFT_TEST_IAM_ROLE"),
		Staging: strings.TrimSuffix(os.Getenv("REDSHIFT_TEST_STAGING"), "/") + "/", QueryTimeout: 5 * time.Minute, LoadTimeout: 10 * time.Minute,
	}
	migrator, err := redshift.NewMigrator(base, redshiftdata.NewFromConfig(awsCfg))
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx)
	require.NoError(t, err)
	again, err := migrator.Migrate(ctx)
	require.NoError(t, err)
	require.Empty(t, again, "migrating twice applies nothing")

	run := time.Now().UnixNano()
	var caseSeq atomic.Int64
	warehousetest.Exercise(t, func(t *testing.T) warehousetest.Harness {
		// Batch ids repeat across cases: each case stages under its own prefix.
		cfg := base
		cfg.Staging = fmt.Sprintf("%slive-%d/case-%d/", base.Staging, run, caseSeq.Add(1))
		wh, err := redshift.New(cfg, redshiftdata.NewFromConfig(awsCfg), s3.NewFromConfig(awsCfg))
		require.NoError(t, err)
		return liveHarness(t, cfg, awsCfg, wh)
	})
}

func liveHarness(t *testing.T, cfg redshift.Config, awsCfg aws.Config, wh *redshift.Warehouse) warehousetest.Harness {
	return warehousetest.Harness{
		Warehouse: wh,
		Records: func(ctx context.Context, tenant, scope string) ([]warehousetest.Row, error) {
			rows, err := wh.Query(ctx, `SELECT batch_id, object_key, line_number, JSON_SERIALIZE(record) FROM curated.fleet_records
				WHERE tenant_id = :tenant_id AND source_scope = :source_scope ORDER BY object_key, line_number`,
				"tenant_id", tenant, "source_scope", scope)
			if err != nil {
				return nil, err
			}
			out := make([]warehousetest.Row, 0, len(rows))
			for _, r := range rows {
				out = append(out, warehousetest.Row{BatchID: long(r[0]), ObjectKey: str(r[1]), Line: long(r[2]), Record: str(r[3])})
			}
			return out, nil
		},
		Publications: func(ctx context.Context, tenant, scope string) ([]warehousetest.Publication, error) {
			rows, err := wh.Query(ctx, `SELECT batch_id, record_count, published_at FROM curated.fleet_publications
				WHERE tenant_id = :tenant_id AND source_scope = :source_scope ORDER BY batch_id`,
				"tenant_id", tenant, "source_scope", scope)
			if err != nil {
				return nil, err
			}
			out := make([]warehousetest.Publication, 0, len(rows))
			for _, r := range rows {
				at, err := time.Parse("2006-01-02 15:04:05.999999", str(r[2]))
				if err != nil {
					return nil, err
				}
				out = append(out, warehousetest.Publication{BatchID: long(r[0]), RecordCount: long(r[1]), PublishedAt: at})
			}
			return out, nil
		},
		AgeCommit: func(ctx context.Context, tenant, scope string, d time.Duration) error {
			return wh.Exec(ctx, []string{`UPDATE curated.fleet_slices SET committed_at = DATEADD(second, -CAST(:seconds AS INT), committed_at)
				WHERE tenant_id = :tenant_id AND source_scope = :source_scope`},
				"seconds", strconv.Itoa(int(d.Seconds())), "tenant_id", tenant, "source_scope", scope)
		},
		// The client dies as soon as its load transaction is submitted: the
		// transaction runs on and commits, as the stamp shows in time.
		DyingLoad: func(t *testing.T, s warehouse.Slice, src *folder.Source, objs []folder.Object) func() {
			kt := &dieAfterLoadSubmit{}
			mortal, err := redshift.New(cfg, redshiftdata.NewFromConfig(awsCfg, func(o *redshiftdata.Options) {
				o.HTTPClient = &http.Client{Transport: kt}
				o.RetryMaxAttempts = 1
			}), s3.NewFromConfig(awsCfg))
			require.NoError(t, err)
			_, err = mortal.Load(context.Background(), s, src, objs, nil)
			require.Error(t, err)
			return func() {
				require.Eventually(t, func() bool {
					st, found, err := wh.Stamp(context.Background(), s.TenantID, s.SourceScope)
					return err == nil && found && st.BatchID == s.BatchID
				}, 5*time.Minute, 2*time.Second)
			}
		},
		OrphanCommits: true,
	}
}

// dieAfterLoadSubmit lets requests through until a load transaction was
// submitted, then fails every request, like a process that died.
type dieAfterLoadSubmit struct{ dead atomic.Bool }

func (d *dieAfterLoadSubmit) RoundTrip(r *http.Request) (*http.Response, error) {
	if d.dead.Load() {
		return nil, fmt.Errorf("the client process is gone")
	}
	var body []byte
	if r.Body != nil && r.Header.Get("X-Amz-Target") == "RedshiftData.BatchExecuteStatement" {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && bytes.Contains(body, []byte("COPY curated.fleet_records")) {
		d.dead.Store(true)
	}
	return resp, err
}

func long(f types.Field) int64 {
	if v, ok := f.(*types.FieldMemberLongValue); ok {
		return v.Value
	}
	return -1
}

func str(f types.Field) string {
	if v, ok := f.(*types.FieldMemberStringValue); ok {
		return v.Value
	}
	return ""
}
