package folder

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

var limitsBucketSeq atomic.Int64

// readLimited reads every record of a mem folder holding files, with limits.
func readLimited(t *testing.T, limits Limits, files map[string]string) ([]Record, error) {
	t.Helper()
	recs, _, err := readWith(t, limits, 0, files)
	return recs, err
}

// readWith reads every record of a mem folder holding files, with limits,
// skipping up to tolerance bad records, which it returns.
func readWith(t *testing.T, limits Limits, tolerance int, files map[string]string) ([]Record, []BadRecord, error) {
	t.Helper()
	bucket := fmt.Sprintf("limits-%d", limitsBucketSeq.Add(1))
	writeMem(t, bucket, files)
	ctx := context.Background()
	f, err := Canonicalize("mem://" + bucket + "/f")
	require.NoError(t, err)
	src, err := Opener{Limits: limits}.Open(ctx, f)
	require.NoError(t, err)
	defer src.Close()
	src.Tolerate(tolerance)
	objs, err := src.Objects(ctx)
	require.NoError(t, err)
	rr := src.Records(ctx, objs)
	defer rr.Close()
	var out []Record
	for rr.Next() {
		r := rr.Record()
		r.JSON = append([]byte(nil), r.JSON...)
		out = append(out, r)
	}
	return out, rr.Bad(), rr.Err()
}

// TestCSVRecordBounds: a CSV record of exactly MaxRecordBytes (line
// terminator included) loads, one byte more fails naming the object and the
// line where the record starts, quoted newlines included.
func TestCSVRecordBounds(t *testing.T) {
	t.Parallel()
	const max = 64
	header := "id,note\n" // 8 bytes
	fits := "1," + strings.Repeat("x", max-3) + "\n"
	require.Len(t, fits, max)
	t.Run("at the bound", func(t *testing.T) {
		t.Parallel()
		recs, err := readLimited(t, Limits{MaxRecordBytes: max}, map[string]string{"f/a.csv": header + fits + fits})
		require.NoError(t, err)
		require.Len(t, recs, 2)
		require.Equal(t, int64(3), recs[1].Line)
	})
	t.Run("one byte over", func(t *testing.T) {
		t.Parallel()
		_, err := readLimited(t, Limits{MaxRecordBytes: max}, map[string]string{
			"f/a.csv": header + fits + "2,\"multi\nline\"\n" + "3," + strings.Repeat("y", max-2) + "\n" + fits,
		})
		require.ErrorIs(t, err, ErrMalformed)
		require.ErrorContains(t, err, "f/a.csv: line 5: record longer than 64 bytes")
	})
	t.Run("a quoted field spanning lines counts whole", func(t *testing.T) {
		t.Parallel()
		_, err := readLimited(t, Limits{MaxRecordBytes: max}, map[string]string{
			"f/a.csv": header + "1,\"" + strings.Repeat("ab\n", 30) + "\"\n",
		})
		require.ErrorContains(t, err, "f/a.csv: line 2: record longer than 64 bytes")
	})
	t.Run("an oversized header", func(t *testing.T) {
		t.Parallel()
		_, err := readLimited(t, Limits{MaxRecordBytes: max}, map[string]string{"f/a.csv": strings.Repeat("h", 100) + "\n1\n"})
		require.ErrorContains(t, err, "f/a.csv: line 1: record longer than 64 bytes")
	})
	t.Run("an unterminated last record", func(t *testing.T) {
		t.Parallel()
		_, err := readLimited(t, Limits{MaxRecordBytes: max}, map[string]string{"f/a.csv": header + "1,\"" + strings.Repeat("z", 200)})
		require.ErrorContains(t, err, "f/a.csv: line 2: record longer than 64 bytes")
	})
}

// TestCSVColumnBound: a header or row with more columns than MaxColumns is
// refused before encoding/csv splits it (a 16 MiB line of commas would
// otherwise cost hundreds of MiB of field slices).
func TestCSVColumnBound(t *testing.T) {
	t.Parallel()
	cols := func(n int) string { return strings.TrimSuffix(strings.Repeat("c,", n), ",") }
	recs, err := readLimited(t, Limits{MaxColumns: 3}, map[string]string{"f/a.csv": "a,b,c\n1,\"x,y\",3\n"})
	require.NoError(t, err, "commas inside quotes are not columns")
	require.Len(t, recs, 1)

	_, err = readLimited(t, Limits{MaxColumns: 3}, map[string]string{"f/b.csv": "a,b,c,d\n1,2,3,4\n"})
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "f/b.csv: line 1: more than 3 columns")

	_, err = readLimited(t, Limits{MaxColumns: 3}, map[string]string{"f/c.csv": "a,b,c\n1,2,3\n" + cols(1000) + "\n"})
	require.ErrorContains(t, err, "f/c.csv: line 3: more than 3 columns")

	// The default bound holds against a line of commas within the byte bound.
	_, err = readLimited(t, Limits{}, map[string]string{"f/d.csv": strings.Repeat(",", 1<<20) + "\n"})
	require.ErrorContains(t, err, fmt.Sprintf("line 1: more than %d columns", MaxColumnsDefault))
}

func TestNDJSONRecordBound(t *testing.T) {
	t.Parallel()
	line := `{"a":"` + strings.Repeat("x", 100-9) + `"}` + "\n"
	require.Len(t, line, 100)
	recs, err := readLimited(t, Limits{MaxRecordBytes: 100}, map[string]string{"f/a.ndjson": line + line})
	require.NoError(t, err)
	require.Len(t, recs, 2)
	_, err = readLimited(t, Limits{MaxRecordBytes: 99}, map[string]string{"f/b.ndjson": line})
	require.ErrorContains(t, err, "f/b.ndjson: line 1 longer than 99 bytes")
}

// ndjsonEscapeCases are NDJSON lines with escapes; storable says whether
// PostgreSQL's jsonb accepts them.
var ndjsonEscapeCases = []struct {
	line     string
	storable bool
}{
	{`{"a":"\\u0000"}`, true},   // the six characters \u0000: text, not NUL
	{`{"a":"\\\\u0000"}`, true}, // two backslashes, then u0000
	{`{"a":"x\\y","b":"\\u0000\\"}`, true},
	{`{"a":"\u0001 \u001f \u00e9"}`, true},
	{`{"a":"\ud83d\ude00"}`, true}, // a surrogate pair
	{`{"a":"\uD83D\uDE00"}`, true},
	{`{"\\u0000":1}`, true},
	{`{"a":"\u0000"}`, false},   // a NUL
	{`{"a":"\\\u0000"}`, false}, // a backslash, then a NUL
	{`{"\u0000":1}`, false},     // NUL in a key
	{`{"a":["ok", {"b":"x\u0000"}]}`, false},
	{`{"a":"\ud800"}`, false},       // lone high surrogate
	{`{"a":"\udc00"}`, false},       // lone low surrogate
	{`{"a":"\ud800\u0041"}`, false}, // high surrogate, no low one
}

// TestNDJSONEscapesMatchWhatJSONBStores reads each case through the record
// reader and casts it to jsonb in PostgreSQL: the reader refuses exactly
// what jsonb refuses (naming object and line), so such a line fails the
// batch before the load instead of in the middle of the warehouse COPY.
func TestNDJSONEscapesMatchWhatJSONBStores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	for i, tc := range ndjsonEscapeCases {
		var stored string
		jsonbErr := conn.QueryRow(ctx, `SELECT $1::text::jsonb::text`, tc.line).Scan(&stored)
		require.Equal(t, tc.storable, jsonbErr == nil, "jsonb and the case disagree on %s: %v", tc.line, jsonbErr)

		name := fmt.Sprintf("f/%d.ndjson", i)
		recs, err := readLimited(t, Limits{}, map[string]string{name: "{}\n" + tc.line + "\n"})
		if tc.storable {
			require.NoError(t, err, tc.line)
			require.JSONEq(t, stored, string(recs[1].JSON), tc.line)
			continue
		}
		require.ErrorIs(t, err, ErrMalformed, tc.line)
		require.ErrorContains(t, err, name+": line 2, column ", tc.line)
		require.ErrorContains(t, err, "cannot be stored", tc.line)
	}
}

func TestStorageErrorsOutOfFilesAreTransient(t *testing.T) {
	t.Parallel()
	require.True(t, IsTransient(&fs.PathError{Op: "open", Path: "/x", Err: syscall.EMFILE}))
	require.True(t, IsTransient(fmt.Errorf("listing: %w", &fs.PathError{Op: "open", Path: "/x", Err: syscall.ENFILE})))
	require.False(t, IsTransient(&fs.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}))
}

// TestUnreadableDirectoryIsAnError: a folder with a directory the process
// may not read is an error naming it, not an empty (or smaller) folder.
// Root reads everything, so as root the check runs in a helper process
// without the capabilities that bypass file permissions.
func TestUnreadableDirectoryIsAnError(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.csv"), []byte("k\n1\n"), 0o644))
	locked := filepath.Join(dir, "locked")
	require.NoError(t, os.Mkdir(locked, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(locked, "b.csv"), []byte("k\n2\n"), 0o644))
	require.NoError(t, os.Chmod(locked, 0))
	t.Cleanup(func() { _ = os.Chmod(locked, 0o755) })

	if os.Geteuid() != 0 {
		checkUnreadable(t, dir)
		return
	}
	setpriv, err := exec.LookPath("setpriv")
	require.NoError(t, err, "as root this test needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
	cmd := exec.Command(setpriv, "--bounding-set=-dac_override,-dac_read_search", os.Args[0],
		"-test.run=^TestUnreadableDirectoryHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "FLEET_UNREADABLE_DIR="+dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "--- PASS: TestUnreadableDirectoryHelperProcess")
	require.Contains(t, string(out), "unreadable-checked")
}

// TestUnreadableDirectoryHelperProcess runs the check of
// TestUnreadableDirectoryIsAnError; it does nothing on its own.
func TestUnreadableDirectoryHelperProcess(t *testing.T) {
	dir := os.Getenv("FLEET_UNREADABLE_DIR")
	if dir == "" {
		return
	}
	checkUnreadable(t, dir)
	fmt.Println("unreadable-checked")
}

func checkUnreadable(t *testing.T, dir string) {
	t.Helper()
	_, err := readAll(t, "file://"+dir)
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrEmpty)
	require.ErrorIs(t, err, fs.ErrPermission)
	require.ErrorContains(t, err, "locked")
	require.False(t, IsTransient(err), "permission denied is not retried")
}
