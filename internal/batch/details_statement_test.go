package batch_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
)

// TestDetailsWarehouseStatement: a document records the warehouse
// statement a delivery submitted and round-trips; documents written before
// the field existed still parse (without it); the field's keys are held to
// the same strictness as the rest, and a key a newer build added to it is
// kept.
func TestDetailsWarehouseStatement(t *testing.T) {
	t.Parallel()
	older := `{"version":1,"phase":"loading","sourceFolder":"s3://b/in","redshiftCommitted":false,"publication":{"started":false,"completed":false}}`
	d, err := batch.ParseDetails([]byte(older))
	require.NoError(t, err)
	require.Nil(t, d.WarehouseStatement, "an older build's document has none")

	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d.WarehouseStatement = &batch.WarehouseStatement{Kind: "load-swap", ID: "d9b6c0c9-1f2e-4a3b-9c8d-7e6f5a4b3c2d", Generation: 3, Attempt: 1, Records: 42, SubmittedAt: at}
	raw, err := d.Marshal()
	require.NoError(t, err)
	require.Contains(t, string(raw), `"warehouseStatement":{"kind":"load-swap","id":"d9b6c0c9-1f2e-4a3b-9c8d-7e6f5a4b3c2d","generation":3,"attempt":1,"records":42,"submittedAt":"2026-01-02T03:04:05Z"}`)
	back, err := batch.ParseDetails(raw)
	require.NoError(t, err)
	require.Equal(t, d.WarehouseStatement, back.WarehouseStatement)

	// Only the submission recorded (no id yet).
	intent := `{"version":1,"phase":"loading","redshiftCommitted":false,"publication":{"started":false,"completed":false},` +
		`"warehouseStatement":{"kind":"load-copy","generation":2,"submittedAt":"2026-01-02T03:04:05Z"}}`
	d, err = batch.ParseDetails([]byte(intent))
	require.NoError(t, err)
	require.Equal(t, "", d.WarehouseStatement.ID)

	for _, bad := range []string{
		strings.Replace(intent, `"kind"`, `"Kind"`, 1),
		strings.Replace(intent, `"generation":2`, `"generation":2,"generation":3`, 1),
		strings.Replace(intent, `"generation":2`, `"generation":"2"`, 1),
	} {
		_, err := batch.ParseDetails([]byte(bad))
		require.ErrorIs(t, err, batch.ErrDetailsInvalid, bad)
	}
	newer, err := batch.ParseDetails([]byte(strings.Replace(intent, `"kind":"load-copy"`, `"kind":"load-copy","statement":"x"`, 1)))
	require.NoError(t, err)
	raw, err = newer.Marshal()
	require.NoError(t, err)
	require.Contains(t, string(raw), `"submittedAt":"2026-01-02T03:04:05Z","statement":"x"}`)
}
