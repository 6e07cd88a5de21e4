package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
)

// TestRunRedshiftHelpDocumentsEverySetting: every Redshift setting is on
// the help page, with its environment variable.
func TestRunRedshiftHelpDocumentsEverySetting(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--warehouse", "redshift", "--help"}, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, stderr.String())
	help := stdout.String()
	for _, s := range []string{
		"--warehouse=", "$WAREHOUSE)", "--warehouse-url", "$WAREHOUSE_URL",
		"--redshift-workgroup", "$REDSHIFT_WORKGROUP", "--redshift-cluster-id", "$REDSHIFT_CLUSTER_ID",
		"--redshift-database", "$REDSHIFT_DATABASE", "--redshift-secret-arn", "$REDSHIFT_SECRET_ARN",
		"--redshift-db-user", "$REDSHIFT_DB_USER", "--redshift-iam-role", "$REDSHIFT_IAM_ROLE",
		"--redshift-staging", "$REDSHIFT_STAGING", "--redshift-load-timeout", "$REDSHIFT_LOAD_TIMEOUT",
		"--redshift-query-timeout", "$REDSHIFT_QUERY_TIMEOUT", "AWS_REGION",
	} {
		require.Contains(t, help, s)
	}
}

// TestRunRedshiftInvalidInput: bad Redshift settings are refused before
// anything connects, naming the flag, with the invalid-input exit code.
func TestRunRedshiftInvalidInput(t *testing.T) {
	t.Parallel()
	good := []string{"run", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--warehouse", "redshift",
		"--redshift-workgroup", "fleet", "--redshift-database", "dev",
		"--redshift-iam-role", "arn:aws:iam::123456789012:role/copy", "--redshift-staging", "s3://staging-bucket/fleet/"}
	without := func(flag string) []string {
		var out []string
		for i := 0; i < len(good); i++ {
			if good[i] == flag {
				i++
				continue
			}
			out = append(out, good[i])
		}
		return out
	}
	cases := []struct {
		args []string
		want string
	}{
		{without("--redshift-workgroup"), "--redshift-workgroup"},
		{append(good, "--redshift-cluster-id", "c1"), "--redshift-workgroup: set either"},
		{without("--redshift-database"), "--redshift-database: required"},
		{without("--redshift-iam-role"), "--redshift-iam-role: required"},
		{append(without("--redshift-iam-role"), "--redshift-iam-role", "copy-role"), "--redshift-iam-role"},
		{without("--redshift-staging"), "--redshift-staging"},
		{append(without("--redshift-staging"), "--redshift-staging", "s3://bucket/it's/"), "--redshift-staging"},
		{append(good, "--redshift-db-user", "loader"), "--redshift-db-user"},
		{append(good, "--warehouse-url", "postgres://x@127.0.0.1/wh"), "--warehouse-url: is for --warehouse postgres"},
		{append(good, "--redshift-load-timeout", "0s"), "--redshift-load-timeout"},
		{[]string{"run", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--redshift-workgroup", "fleet"}, "the --redshift-* settings need --warehouse redshift"},
		{[]string{"run", "--warehouse", "bigquery"}, "--warehouse"},
	}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), c.args, &stdout, &stderr)
		require.Equal(t, cli.ExitInvalidInput, code, "%v: %s", c.args, stderr.String())
		require.Contains(t, stderr.String(), c.want, "%v", c.args)
		require.NotContains(t, stderr.String(), "unreachable", "nothing connected")
	}
}

// TestMigrateRedshift applies the operational migrations and the Redshift
// schema (through the Data API, here its double), then again: nothing.
// It sets the AWS environment, so it does not run in parallel.
func TestMigrateRedshift(t *testing.T) {
	srv := s3test.Start(t)
	double := redshifttest.Start(t, redshifttest.Options{DatabaseURL: pgtest.EmptyDatabaseURL(t), S3: srv.Client(), Workgroup: "fleet", Database: "dev"})
	for _, kv := range append(srv.Env(), double.Env()...) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	url := pgtest.NewDatabaseURLAt(t, 1)
	args := []string{"migrate", "--database-url", url, "--warehouse", "redshift", "--redshift-workgroup", "fleet", "--redshift-database", "dev"}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, stderr.String())
	require.Contains(t, stdout.String(), "applied project migration 2")
	require.Contains(t, stdout.String(), "applied warehouse migration 1 redshift/00001_curated_fleet.sql")
	var tables int
	require.NoError(t, double.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = 'curated' AND tablename IN ('fleet_records', 'fleet_slices', 'fleet_publications', 'fleet_warehouse_migrations', 'fleet_writer_lock')`).Scan(&tables))
	require.Equal(t, 5, tables)
	var local int
	require.NoError(t, pgtest.Pool(t, url).QueryRow(context.Background(),
		`SELECT count(*) FROM pg_namespace WHERE nspname = 'curated'`).Scan(&local))
	require.Zero(t, local, "no local warehouse schema when the warehouse is Redshift")

	stdout.Reset()
	code = run(context.Background(), args, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, stderr.String())
	require.Equal(t, "database schema is current: nothing to apply\nbatch ids: the warehouse names batches up to 0; the id sequence stands at 0\n", stdout.String())

	stdout.Reset()
	stderr.Reset()
	code = run(context.Background(), []string{"migrate", "--database-url", url, "--warehouse", "redshift", "--redshift-database", "dev"}, &stdout, &stderr)
	require.Equal(t, cli.ExitInvalidInput, code)
	require.Contains(t, stderr.String(), "--redshift-workgroup")
}

// TestTestDoublesAreNotInTheBinaries: the Data API double, the S3 test
// server and the contract suite are for tests only.
func TestTestDoublesAreNotInTheBinaries(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/fleet/ingest/cmd/worker", "github.com/fleet/ingest/cmd/enqueue").CombinedOutput()
	require.NoError(t, err, string(out))
	deps := string(out)
	require.Contains(t, deps, "github.com/fleet/ingest/internal/warehouse/redshift\n", "the worker links the Redshift warehouse")
	for _, test := range []string{"redshifttest", "warehousetest", "internal/testkit/s3test", "gofakes3"} {
		require.NotContains(t, deps, test)
	}
}
