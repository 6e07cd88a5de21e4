package redshift_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

// TestWhatSuperRefusesIsRefusedBeforeStaging: a NUL (\u0000, or a raw NUL
// in a CSV field) and an unpaired UTF-16 surrogate escape are refused
// while the folder is read (package folder refuses them for every
// warehouse), naming object and line; nothing is staged or submitted.
func TestWhatSuperRefusesIsRefusedBeforeStaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i, c := range []struct {
		file, body, want string
	}{
		{"r.ndjson", `{"ok":1}` + "\n" + `{"bad":"a\u0000b"}` + "\n", `NUL characters (\u0000)`},
		{"r.ndjson", `{"ok":1}` + "\n" + `{"bad":"\ud800"}` + "\n", "unpaired UTF-16 surrogate"},
		{"r.ndjson", `{"ok":1}` + "\n" + `{"bad":"\udc00\ud800"}` + "\n", "unpaired UTF-16 surrogate"},
		{"r.csv", "id,note\n1,ok\n2,a\x00b\n", "NUL characters"},
	} {
		_, err := e.load(t, warehouse.Slice{TenantID: "tenant-1", SourceScope: fmt.Sprintf("fleet_s3:mem://super/%d", i), BatchID: int64(i + 1), Generation: 1},
			map[string]string{c.file: c.body})
		require.ErrorIs(t, err, folder.ErrMalformed, c.body)
		require.Contains(t, err.Error(), "in/"+c.file, c.body)
		require.Contains(t, err.Error(), c.want, c.body)
	}
	require.Zero(t, e.loadSubmissions(), "nothing was submitted")
	require.Empty(t, e.stagingKeys(t), "nothing is left staged")
	// A paired surrogate (an astral character) is fine.
	st, err := e.load(t, warehouse.Slice{TenantID: "tenant-1", SourceScope: "fleet_s3:mem://super/ok", BatchID: 9, Generation: 1},
		map[string]string{"r.ndjson": `{"emoji":"\ud83d\ude00"}` + "\n"})
	require.NoError(t, err)
	require.Equal(t, int64(1), st.RecordCount)
}

// TestCommittedAtIsTheSwap: a slice's committed_at is the warehouse clock
// when its swap ran, not when its load (or its COPY) began, so the
// publication window starts at the commit.
func TestCommittedAtIsTheSwap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const held = 1500 * time.Millisecond
	e.double.Inject(redshifttest.Fault{Match: copyMatch, CopyDelay: held})
	src, objs, scope := warehousetest.Source(t, map[string]string{"x.csv": csvRows("a", 2)})
	var dbStart time.Time
	require.NoError(t, e.double.Pool.QueryRow(context.Background(), `SELECT timezone('UTC', clock_timestamp())`).Scan(&dbStart))
	st, err := e.wh.Load(context.Background(), warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 1, Generation: 1}, src, objs, nil)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.CommittedAt.Sub(dbStart.UTC()), held, "committed after the COPY, at the swap")
}
