package redshift_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

const (
	testWorkgroup = "fleet-test"
	testDatabase  = "dev"
	testRole      = "arn:aws:iam::123456789012:role/fleet-copy"
	stagingBucket = "fleet-staging"
)

// swapMatch selects a load's swap transaction for a fault; copyMatch its
// COPY into the staging table.
const (
	swapMatch = "INSERT INTO curated.fleet_records"
	copyMatch = "COPY curated_staging."
)

// env is one Redshift warehouse on the Data API double and an S3 server.
type env struct {
	s3     *s3test.Server
	double *redshifttest.Double
	cfg    redshift.Config
	wh     *redshift.Warehouse
}

func testConfig() redshift.Config {
	return redshift.Config{
		WorkgroupName: testWorkgroup, Database: testDatabase, IAMRole: testRole,
		Staging:      "s3://" + stagingBucket + "/fleet/staging/",
		PollInterval: 5 * time.Millisecond, PollMax: 50 * time.Millisecond,
		LoadPollInterval: 5 * time.Millisecond, LoadPollMax: 50 * time.Millisecond,
		RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	}
}

// newEnv starts the servers and migrates the warehouse; adjust tunes the
// configuration first.
func newEnv(t *testing.T, adjust ...func(*redshift.Config)) *env {
	t.Helper()
	e := &env{s3: s3test.Start(t), cfg: testConfig()}
	e.s3.CreateBucket(t, stagingBucket)
	e.double = redshifttest.Start(t, redshifttest.Options{
		DatabaseURL: pgtest.EmptyDatabaseURL(t), S3: e.s3.Client(), Workgroup: testWorkgroup, Database: testDatabase,
	})
	for _, f := range adjust {
		f(&e.cfg)
	}
	e.wh = e.warehouse(t, e.double.Client())
	applied, err := e.wh.Migrate(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, applied)
	return e
}

// The identities of newEnvWithIdentities: each component has a Secrets
// Manager secret of its own.
const (
	adminSecret  = "arn:aws:secretsmanager:us-east-1:123456789012:secret:fleet-admin-AbCdEf"
	loaderSecret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:fleet-loader-AbCdEf"
	readerSecret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:fleet-reader-AbCdEf"
	nobodySecret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:fleet-nobody-AbCdEf"
)

// newEnvWithIdentities is newEnv with database users modelled: the schema
// is migrated as the owner (adminSecret), the warehouse works as the
// loader (loaderSecret: role fleet_loader); readerSecret holds
// fleet_reader, nobodySecret no role.
func newEnvWithIdentities(t *testing.T) *env {
	t.Helper()
	e := &env{s3: s3test.Start(t), cfg: testConfig()}
	e.s3.CreateBucket(t, stagingBucket)
	e.double = redshifttest.Start(t, redshifttest.Options{
		DatabaseURL: pgtest.EmptyDatabaseURL(t), S3: e.s3.Client(), Workgroup: testWorkgroup, Database: testDatabase,
		Identities: map[string]redshifttest.Identity{
			redshifttest.IdentityKey(adminSecret, "", ""):  {User: "fleet_admin", Owner: true},
			redshifttest.IdentityKey(loaderSecret, "", ""): {User: "fleet_worker", Roles: []string{"fleet_loader"}},
			redshifttest.IdentityKey(readerSecret, "", ""): {User: "fleet_enqueue", Roles: []string{"fleet_reader"}},
			redshifttest.IdentityKey(nobodySecret, "", ""): {User: "fleet_nobody"},
		},
	})
	admin := e.cfg
	admin.SecretARN = adminSecret
	m, err := redshift.NewMigrator(admin, e.double.Client())
	require.NoError(t, err)
	applied, err := m.Migrate(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, applied)
	e.cfg.SecretARN = loaderSecret
	e.wh = e.warehouse(t, e.double.Client())
	return e
}

func (e *env) warehouse(t *testing.T, data *redshiftdata.Client) *redshift.Warehouse {
	t.Helper()
	wh, err := redshift.New(e.cfg, data, e.s3.Client())
	require.NoError(t, err)
	return wh
}

// killableTransport fails every request once killed, like a process that
// died: no more Data API calls, not even a cancellation.
type killableTransport struct {
	dead atomic.Bool
}

func (k *killableTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if k.dead.Load() {
		return nil, errors.New("the client process is gone")
	}
	return http.DefaultTransport.RoundTrip(r)
}

// mortal returns a warehouse whose Data API client kt can kill; once dead,
// its requests fail until its LoadTimeout passes. The deadline is short,
// but long enough for a loaded machine to reach the held statement before
// it (tests hold the statement, then kill the client).
func (e *env) mortal(t *testing.T, kt *killableTransport) *redshift.Warehouse {
	t.Helper()
	cfg := e.cfg
	cfg.LoadTimeout, cfg.QueryTimeout = 3*time.Second, 3*time.Second
	wh, err := redshift.New(cfg, e.mortalClient(kt), e.s3.Client())
	require.NoError(t, err)
	return wh
}

// mortalClient returns a Data API client on the double that kt can kill.
func (e *env) mortalClient(kt *killableTransport) *redshiftdata.Client {
	return redshiftdata.New(redshiftdata.Options{
		Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("double", "double-secret", ""),
		BaseEndpoint: aws.String(e.double.URL), HTTPClient: &http.Client{Transport: kt}, RetryMaxAttempts: 1,
	})
}

func (e *env) harness() warehousetest.Harness {
	records, pubs, age := warehousetest.PoolReaders(e.double.Pool)
	return warehousetest.Harness{
		Warehouse: e.wh, Records: records, Publications: pubs, AgeCommit: age,
		// The client dies while its transaction runs on the warehouse: the
		// double holds the transaction before its commit, the client's
		// process "dies" (every further request fails), then the
		// transaction is let go and commits.
		DyingLoad: func(t *testing.T, s warehouse.Slice, src *folder.Source, objs []folder.Object) func() {
			kt := &killableTransport{}
			mortal := e.mortal(t, kt)
			in := e.double.Inject(redshifttest.Fault{Match: swapMatch, Hold: true})
			errc := make(chan error, 1)
			go func() {
				_, err := mortal.Load(context.Background(), s, src, objs, nil)
				errc <- err
			}()
			select {
			case <-in.Held():
			case err := <-errc:
				t.Fatalf("the load ended before its transaction was held: %v", err)
			}
			kt.dead.Store(true)
			require.Error(t, testproc.Await(t, errc, "the dead client's load to end"), "a client that died does not learn its outcome")
			return func() {
				in.Release()
				waitEnded(t, in)
			}
		},
		OrphanCommits: true,
		LedgerRows:    warehousetest.PoolLedger(e.double.Pool),
		ErrorRows:     warehousetest.PoolErrors(e.double.Pool),
		// The swap fails at its last statement, after it replaced the
		// slice's records, its stamp and its ledger rows: the transaction
		// is rolled back, as when the cluster loses it before its commit.
		KilledLoad: func(t *testing.T, s warehouse.Slice, src *folder.Source, objs []folder.Object) {
			in := e.double.Inject(redshifttest.Fault{Match: swapMatch, FailAt: redshift.SwapStatements(true), Error: "ERROR: the transaction was lost before its commit"})
			_, err := e.wh.Load(context.Background(), s, src, objs, nil)
			require.ErrorContains(t, err, "lost before its commit")
			waitEnded(t, in)
		},
	}
}

// TestRedshiftContract holds the Redshift warehouse, on the Data API
// double, to the Warehouse contract, migrated as the owner and working as
// the loader (role fleet_loader only).
func TestRedshiftContract(t *testing.T) {
	t.Parallel()
	warehousetest.Exercise(t, func(t *testing.T) warehousetest.Harness {
		return newEnvWithIdentities(t).harness()
	})
}
