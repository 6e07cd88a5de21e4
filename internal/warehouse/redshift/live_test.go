package redshift_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
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
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

// liveEnv names the settings of the live test.
var liveEnv = []string{"REDSHIFT_TEST_WORKGROUP", "REDSHIFT_TEST_DATABASE", "REDSHIFT_TEST_IAM_ROLE", "REDSHIFT_TEST_STAGING"}

// TestLiveRedshiftServerless runs the Warehouse contract against a real
// Redshift Serverless workgroup, then what a first production run must
// prove (see liveFirstRun): opt in by setting REDSHIFT_TEST_WORKGROUP,
// REDSHIFT_TEST_DATABASE, REDSHIFT_TEST_IAM_ROLE (the COPY role) and
// REDSHIFT_TEST_STAGING (s3://bucket/prefix/), with AWS credentials and
// AWS_REGION in the environment ("make redshift-live" says what is
// missing). Optional: REDSHIFT_TEST_SECRET_ARN (the schema owner, which
// migrates), REDSHIFT_TEST_LOADER_SECRET_ARN and
// REDSHIFT_TEST_READER_SECRET_ARN (users an administrator granted
// fleet_loader and fleet_reader), REDSHIFT_TEST_DEFAULT_ROLE=1 (the
// workgroup has a default IAM role that may read the staging prefix). It
// migrates schema curated there and leaves its test tenants' rows behind.
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
	work := base
	if loader := os.Getenv("REDSHIFT_TEST_LOADER_SECRET_ARN"); loader != "" {
		work.SecretARN = loader // the contract runs as the loader, as the workers do
	}
	t.Run("FirstRun", func(t *testing.T) { liveFirstRun(t, work, awsCfg, run) })
	var caseSeq atomic.Int64
	warehousetest.Exercise(t, func(t *testing.T) warehousetest.Harness {
		// Batch ids repeat across cases: each case stages under its own prefix.
		cfg := work
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
			rows, err := wh.Query(ctx, `SELECT batch_id, record_count, published_at, COALESCE(batch_uid, '') FROM curated.fleet_publications
				WHERE tenant_id = :tenant_id AND source_scope = :source_scope ORDER BY batch_id, batch_uid`,
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
				out = append(out, warehousetest.Publication{BatchID: long(r[0]), BatchUID: str(r[3]), RecordCount: long(r[1]), PublishedAt: at})
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
			dying := cfg
			dying.LoadTimeout = 30 * time.Second // dead, it asks until then
			mortal, err := redshift.New(dying, redshiftdata.NewFromConfig(awsCfg, func(o *redshiftdata.Options) {
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

// dieAfterLoadSubmit lets requests through until a load's swap was
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
	if err == nil && bytes.Contains(body, []byte("INSERT INTO curated.fleet_records")) {
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

// liveFirstRun is what a first production run must prove on the real
// warehouse, beyond the contract: separate identities hold only their
// grants; two tenants' loads run concurrently; a publication completes
// during another tenant's COPY; COPY works with IAM_ROLE default and with
// an ARN; Redshift's conflict messages are classified transient.
func liveFirstRun(t *testing.T, cfg redshift.Config, awsCfg aws.Config, run int64) {
	ctx := context.Background()
	open := func(t *testing.T, c redshift.Config, name string) *redshift.Warehouse {
		c.Staging = fmt.Sprintf("%slive-%d/%s/", cfg.Staging, run, name)
		wh, err := redshift.New(c, redshiftdata.NewFromConfig(awsCfg), s3.NewFromConfig(awsCfg))
		require.NoError(t, err)
		return wh
	}
	tenant := func(name string) string { return fmt.Sprintf("live-%d-%s", run, name) }
	load := func(t *testing.T, wh *redshift.Warehouse, tenantID string, batchID int64, rows int, j warehouse.Journal) (warehouse.Slice, time.Duration) {
		src, objs, scope := warehousetest.Source(t, map[string]string{"x.csv": csvRows(tenantID, rows)})
		s := warehouse.Slice{TenantID: tenantID, SourceScope: scope, BatchID: batchID, Generation: 1}
		lctx := ctx
		if j != nil {
			lctx = warehouse.WithJournal(ctx, j)
		}
		start := time.Now()
		st, err := wh.Load(lctx, s, src, objs, nil)
		require.NoError(t, err, tenantID)
		require.Equal(t, int64(rows), st.RecordCount)
		return s, time.Since(start)
	}

	t.Run("SeparateIdentities", func(t *testing.T) {
		reader := os.Getenv("REDSHIFT_TEST_READER_SECRET_ARN")
		if os.Getenv("REDSHIFT_TEST_LOADER_SECRET_ARN") == "" || reader == "" {
			t.Skip("set REDSHIFT_TEST_LOADER_SECRET_ARN and REDSHIFT_TEST_READER_SECRET_ARN (users granted fleet_loader and fleet_reader) to prove the grants")
		}
		wh := open(t, cfg, "identities")
		s, _ := load(t, wh, tenant("identities"), 1, 10, nil)
		_, err := wh.Publish(ctx, s, time.Hour, nil)
		require.NoError(t, err, "the loader loads and publishes")
		require.Error(t, wh.Exec(ctx, []string{"CREATE TABLE curated.fleet_live_intruder (a INT)"}), "the loader cannot change the schema")
		rc := cfg
		rc.SecretARN = reader
		stamps, err := redshift.NewStamps(rc, redshiftdata.NewFromConfig(awsCfg))
		require.NoError(t, err)
		st, found, err := stamps.Stamp(ctx, s.TenantID, s.SourceScope)
		require.NoError(t, err, "the reader reads stamps")
		require.True(t, found)
		require.Equal(t, int64(1), st.BatchID)
		rw := open(t, rc, "reader")
		err = rw.Exec(ctx, []string{"DELETE FROM curated.fleet_slices WHERE batch_id = -1"})
		require.ErrorContains(t, err, "permission denied", "the reader cannot write")
	})

	t.Run("TwoTenantsLoadConcurrently", func(t *testing.T) {
		wh := open(t, cfg, "concurrent")
		var wg sync.WaitGroup
		took := make([]time.Duration, 2)
		for i, name := range []string{"a", "b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, took[i] = load(t, wh, tenant("concurrent-"+name), int64(i+1), 50_000, nil)
			}()
		}
		wg.Wait()
		t.Logf("two concurrent loads of 50,000 rows: %s and %s", took[0], took[1])
	})

	t.Run("PublicationDuringACopy", func(t *testing.T) {
		wh := open(t, cfg, "during-copy")
		c, _ := load(t, wh, tenant("during-copy-c"), 1, 10, nil)
		copying := make(chan struct{})
		var once sync.Once
		j := &memJournal{onRecord: func(st warehouse.Statement) error {
			if st.Kind == "redshift-load-copy" && st.ID != "" {
				once.Do(func() { close(copying) })
			}
			return nil
		}}
		done := make(chan time.Duration, 1)
		go func() {
			_, took := load(t, wh, tenant("during-copy-a"), 2, 1_000_000, j)
			done <- took
		}()
		<-copying
		start := time.Now()
		_, err := wh.Publish(ctx, c, time.Hour, nil)
		require.NoError(t, err)
		pub := time.Since(start)
		rec, copyRunning := j.Pending()
		took := <-done
		t.Logf("publication of C: %s; A's COPY still running when it ended: %v (%s); A's whole load: %s", pub, copyRunning, rec.Kind, took)
		if copyRunning && rec.Kind == "redshift-load-copy" {
			require.Less(t, pub, 10*time.Second, "a publication does not wait on another tenant's COPY")
		} else {
			t.Log("inconclusive: A's COPY ended before C's publication; stage a larger folder")
		}
	})

	t.Run("IAMRoleDefaultAndARN", func(t *testing.T) {
		load(t, open(t, cfg, "role-arn"), tenant("role-arn"), 1, 10, nil)
		if os.Getenv("REDSHIFT_TEST_DEFAULT_ROLE") != "1" {
			t.Skip("COPY with IAM_ROLE default: set REDSHIFT_TEST_DEFAULT_ROLE=1 when the workgroup has a default IAM role that may read the staging prefix")
		}
		dc := cfg
		dc.IAMRole = "default"
		load(t, open(t, dc, "role-default"), tenant("role-default"), 1, 10, nil)
	})

	t.Run("ConflictsAreTransient", func(t *testing.T) {
		wh := open(t, cfg, "conflicts")
		table := fmt.Sprintf("curated_staging.fleet_live_conflict_%d", run)
		require.NoError(t, wh.Exec(ctx, []string{"CREATE TABLE " + table + " (n BIGINT)"}))
		t.Cleanup(func() { _ = wh.Exec(context.Background(), []string{"DROP TABLE " + table}) })
		// Two transactions that each read the table and write it: one of
		// them violates serializable isolation.
		tx := []string{"INSERT INTO " + table + " SELECT count(*) FROM " + table, "SELECT count(*) FROM " + table}
		for attempt := range 10 {
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = wh.Exec(ctx, tx) }()
			}
			wg.Wait()
			for _, err := range errs {
				var se *redshift.StatementError
				if errors.As(err, &se) {
					t.Logf("attempt %d: %s", attempt, se.Message)
					require.True(t, se.Transient, "Redshift's conflict is classified transient: %s", se.Message)
					require.True(t, pipeline.IsTransient(err))
					return
				}
				require.NoError(t, err)
			}
		}
		t.Log("inconclusive: no conflict in 10 concurrent pairs")
	})
}
