package redshift

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/service/redshiftdata/types"

	"github.com/fleet/ingest/internal/warehouse"
)

// Query runs one read statement for tests that look into a live warehouse.
func (w *Warehouse) Query(ctx context.Context, sql string, kv ...string) ([][]types.Field, error) {
	return w.queryParams(ctx, "fleet-test-query", sql, params(kv...))
}

// Exec runs statements as one transaction for tests.
func (w *Warehouse) Exec(ctx context.Context, sqls []string, kv ...string) error {
	return w.execParams(ctx, "fleet-test-exec", sqls, params(kv...))
}

// QuoteLiteral is the one quoting function, for its fuzz test.
var QuoteLiteral = quoteLiteral

// SwapStatements is the number of statements of a load's swap
// transaction, with or without staged records: a fault at the last one
// fails the swap after every write.
func SwapStatements(staged bool) int {
	s := warehouse.Slice{TenantID: "t", SourceScope: "s", BatchID: 1, Generation: 1}
	v, _ := sliceValues(s)
	return len(swapSQL(s, v, 1, staged))
}
