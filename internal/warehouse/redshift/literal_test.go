package redshift_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

// readLiteral reads a Redshift string literal at the start of q as
// Redshift does (” is a quote, a backslash escapes the next character)
// and returns its value and the rest of q after its closing quote.
func readLiteral(q string) (string, string, bool) {
	if !strings.HasPrefix(q, "'") {
		return "", "", false
	}
	var b strings.Builder
	for i := 1; i < len(q); i++ {
		switch c := q[i]; {
		case c == '\\' && i+1 < len(q):
			b.WriteByte(q[i+1])
			i++
		case c == '\'' && i+1 < len(q) && q[i+1] == '\'':
			b.WriteByte('\'')
			i++
		case c == '\'':
			return b.String(), q[i+1:], true
		default:
			b.WriteByte(c)
		}
	}
	return "", "", false
}

// FuzzQuoteLiteral: whatever a tenant id, scope or object key holds, its
// literal ends exactly where it should (nothing after it is read as SQL)
// and reads back as the value; what no literal can carry (NUL, invalid
// UTF-8) is refused.
func FuzzQuoteLiteral(f *testing.F) {
	for _, s := range []string{"", "tenant-1", "o'hara", `back\`, `\'`, `''`, `\\'`, "fleet_s3:s3://b/k", ":tenant_id", "a'; DROP TABLE curated.fleet_slices; --", "é\u2028", "\x00", "\xff", "x\\\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := redshift.QuoteLiteral(s)
		if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)
		v, rest, ok := readLiteral(q)
		require.True(t, ok, "%q does not close", q)
		require.Empty(t, rest, "%q ends before its end", q)
		require.Equal(t, s, v)
	})
}

// TestHostileTenantAndScopeRoundTrip: tenant ids and scopes that hold
// quotes, backslashes, :names and SQL reach the warehouse as themselves.
func TestHostileTenantAndScopeRoundTrip(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for i, tenant := range []string{`o'hara`, `back\`, `\'); DROP TABLE curated.fleet_slices; --`, ":tenant_id", "t\u00e9n\u2028ant", "super SYSDATE GETDATE() IDENTITY(1, 1) TO ROLE x"} {
		src, objs, scope := warehousetest.Source(t, map[string]string{"x.csv": csvRows("a", 2)})
		scope += `'\:source_scope`
		s := warehouse.Slice{TenantID: tenant, SourceScope: scope, BatchID: int64(i + 1), Generation: 1}
		st, err := e.wh.Load(ctx, s, src, objs, nil)
		require.NoError(t, err, tenant)
		require.Equal(t, int64(2), st.RecordCount)
		st, err = e.wh.Publish(ctx, s, 3600e9, nil)
		require.NoError(t, err, tenant)
		require.NotNil(t, st.PublishedAt)
		var n int
		require.NoError(t, e.double.Pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_records WHERE tenant_id = $1 AND source_scope = $2`, tenant, scope).Scan(&n))
		require.Equal(t, 2, n, tenant)
		require.NoError(t, e.double.Pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_publications WHERE tenant_id = $1 AND source_scope = $2`, tenant, scope).Scan(&n))
		require.Equal(t, 1, n, tenant)
	}
	_, err := e.wh.Load(ctx, warehouse.Slice{TenantID: "nul\x00", SourceScope: "fleet_s3:mem://x/y", BatchID: 99, Generation: 1}, nil, nil, nil)
	require.Error(t, err, "NUL cannot be quoted")
	require.Equal(t, 12, e.loadSubmissions(), "a COPY and a swap for each tenant, nothing for the NUL")
}

func apiCode(err error) string {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode()
	}
	return ""
}

// TestTheDoubleRefusesWhatTheDataAPIDocumentsAsRefused: parameters only on
// SELECT, INSERT, UPDATE and DELETE; no :name inside a literal of a
// parameterised request; at most 40 statements a batch; statements of at
// most 100 KB; at most 200 active statements.
func TestTheDoubleRefusesWhatTheDataAPIDocumentsAsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	c := e.double.Client()
	p := []types.SqlParameter{{Name: aws.String("x"), Value: aws.String("1")}}
	batch := func(sqls []string, params []types.SqlParameter) error {
		_, err := c.BatchExecuteStatement(ctx, &redshiftdata.BatchExecuteStatementInput{
			Sqls: sqls, Parameters: params, WorkgroupName: aws.String(testWorkgroup), Database: aws.String(testDatabase)})
		return err
	}
	for _, sqls := range [][]string{
		{"LOCK curated.fleet_writer_lock", "SELECT :x"},
		{"COPY curated.fleet_records (tenant_id) FROM 's3://b/m' IAM_ROLE default MANIFEST FORMAT AS JSON 'auto' GZIP", "SELECT :x"},
		{"CREATE TABLE curated_staging.t (a INT)", "INSERT INTO curated_staging.t VALUES (:x)"},
		{"SELECT ':tenant_id', :x"},
	} {
		err := batch(sqls, p)
		require.Equal(t, "ValidationException", apiCode(err), "%q: %v", sqls, err)
	}
	require.NoError(t, batch([]string{"SELECT ':x is text here'"}, nil), "without parameters a literal may hold anything")
	require.NoError(t, batch([]string{"SELECT 1 WHERE 1 = :x", "  -- a comment\nDELETE FROM curated.fleet_slices WHERE batch_id = :x"}, p))

	forty := make([]string, 40)
	for i := range forty {
		forty[i] = "SELECT 1"
	}
	require.NoError(t, batch(forty, nil))
	require.Equal(t, "ValidationException", apiCode(batch(append(forty, "SELECT 1"), nil)), "41 statements")
	require.Equal(t, "ValidationException", apiCode(batch([]string{"SELECT '" + strings.Repeat("x", 100_001) + "'"}, nil)), "over 100 KB")

	// The statements above run on after their submissions returned; on a
	// busy machine some are still active, and would count against the 200.
	require.Eventually(t, func() bool { return e.double.Active() == 0 }, 30*time.Second, 10*time.Millisecond, "the earlier statements finish")
	var ids []string
	for range 200 {
		out, err := c.ExecuteStatement(ctx, &redshiftdata.ExecuteStatementInput{Sql: aws.String("SELECT pg_sleep(60)"),
			WorkgroupName: aws.String(testWorkgroup), Database: aws.String(testDatabase)})
		require.NoError(t, err)
		ids = append(ids, aws.ToString(out.Id))
	}
	_, err := c.ExecuteStatement(ctx, &redshiftdata.ExecuteStatementInput{Sql: aws.String("SELECT 1"),
		WorkgroupName: aws.String(testWorkgroup), Database: aws.String(testDatabase)})
	require.Equal(t, "ActiveStatementsExceededException", apiCode(err), "the 201st active statement: %v", err)
	for _, id := range ids {
		_, _ = c.CancelStatement(ctx, &redshiftdata.CancelStatementInput{Id: aws.String(id)})
	}
}
