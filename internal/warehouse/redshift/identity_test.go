package redshift_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

// TestEachIdentityHasOnlyItsGrants: with database users modelled, the
// loader loads and publishes but cannot change the schema or the migration
// record, nor read beyond its tables; the reader reads stamps and nothing
// else; a user without a role reads nothing; unknown credentials are
// refused.
func TestEachIdentityHasOnlyItsGrants(t *testing.T) {
	t.Parallel()
	e := newEnvWithIdentities(t)
	ctx := context.Background()
	src, objs, scope := warehousetest.Source(t, map[string]string{"x.csv": csvRows("a", 3)})
	s := warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 1, Generation: 1}
	_, err := e.wh.Load(ctx, s, src, objs, nil)
	require.NoError(t, err, "the loader loads")
	_, err = e.wh.Publish(ctx, s, time.Hour, nil)
	require.NoError(t, err, "the loader publishes")

	for _, sqls := range [][]string{
		{"CREATE TABLE curated.intruder (a INT)"},
		{"DROP TABLE curated.fleet_slices"},
		{"INSERT INTO curated.fleet_warehouse_migrations (version, name) VALUES (99, 'x')"},
		{"CREATE ROLE intruder"},
	} {
		err := e.wh.Exec(ctx, sqls)
		require.Error(t, err, "the loader: %q", sqls)
		require.Regexp(t, "permission denied|must be owner", err.Error(), "the loader: %q", sqls)
	}

	stamps := func(secret string) *redshift.Stamps {
		cfg := e.cfg
		cfg.SecretARN = secret
		st, err := redshift.NewStamps(cfg, e.double.Client())
		require.NoError(t, err)
		return st
	}
	st, found, err := stamps(readerSecret).Stamp(ctx, s.TenantID, s.SourceScope)
	require.NoError(t, err, "the reader reads stamps")
	require.True(t, found)
	require.Equal(t, int64(1), st.BatchID)

	reader := e.cfg
	reader.SecretARN = readerSecret
	rw, err := redshift.New(reader, e.double.Client(), e.s3.Client())
	require.NoError(t, err)
	for _, sqls := range [][]string{
		{"DELETE FROM curated.fleet_slices"},
		{"SELECT count(*) FROM curated.fleet_records"},
		{"LOCK curated.fleet_writer_lock"},
	} {
		require.ErrorContains(t, rw.Exec(ctx, sqls), "permission denied", "the reader: %q", sqls)
	}
	src2, objs2, _ := warehousetest.Source(t, map[string]string{"x.csv": csvRows("b", 3)})
	_, err = rw.Load(ctx, warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 2, Generation: 1}, src2, objs2, nil)
	require.ErrorContains(t, err, "permission denied", "the reader cannot load")

	_, _, err = stamps(nobodySecret).Stamp(ctx, s.TenantID, s.SourceScope)
	require.ErrorContains(t, err, "permission denied", "a user without a role reads nothing")
	_, _, err = stamps("arn:aws:secretsmanager:us-east-1:123456789012:secret:unknown-AbCdEf").Stamp(ctx, s.TenantID, s.SourceScope)
	require.ErrorContains(t, err, "no database user")
}
