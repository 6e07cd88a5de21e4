package folder

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func writeMem(t *testing.T, bucket string, files map[string]string) {
	t.Helper()
	for k, v := range files {
		require.NoError(t, MemBucket(bucket).WriteAll(context.Background(), k, []byte(v), nil))
	}
}

func readAll(t *testing.T, raw string) ([]Record, error) {
	t.Helper()
	ctx := context.Background()
	f, err := Canonicalize(raw)
	require.NoError(t, err)
	src, err := Opener{}.Open(ctx, f)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	objs, err := src.Objects(ctx)
	if err != nil {
		return nil, err
	}
	rr := src.Records(ctx, objs)
	defer rr.Close()
	var out []Record
	for rr.Next() {
		r := rr.Record()
		r.JSON = append([]byte(nil), r.JSON...)
		out = append(out, r)
	}
	return out, rr.Err()
}

func TestRecordsFromMemFolder(t *testing.T) {
	t.Parallel()
	writeMem(t, "source-test", map[string]string{
		"up/1/_SUCCESS":      "",
		"up/1/manifest.json": `{"files": 2}`,
		"up/1/.hidden.csv":   "x\n1\n",
		"up/1/_tmp/part.csv": "x\n1\n",
		"up/1/a.csv":         "\xef\xbb\xbfid,name,note\n1,Ann,\"multi\nline\"\n2,\"Bo \"\"B\"\"\",\\ tab\t\n",
		"up/1/b/c.NDJSON":    "{\"id\": 3}\n\n  {\"id\": 4, \"nested\": {\"k\": [1, 2]}}  \n",
		"up/1/d.jsonl":       `{"id": 5}`,
		"up/10/other.csv":    "id\n99\n", // a sibling folder sharing the prefix
		"up/1-other/x.csv":   "id\n98\n",
	})
	recs, err := readAll(t, "mem://source-test/up/1/")
	require.NoError(t, err)
	require.Len(t, recs, 5)

	require.Equal(t, "up/1/a.csv", recs[0].ObjectKey)
	require.Equal(t, int64(2), recs[0].Line)
	require.JSONEq(t, `{"id":"1","name":"Ann","note":"multi\nline"}`, string(recs[0].JSON))
	require.Equal(t, int64(4), recs[1].Line, "line where the row starts")
	require.JSONEq(t, `{"id":"2","name":"Bo \"B\"","note":"\\ tab\t"}`, string(recs[1].JSON))

	require.Equal(t, "up/1/b/c.NDJSON", recs[2].ObjectKey)
	require.Equal(t, int64(1), recs[2].Line)
	require.Equal(t, int64(3), recs[3].Line, "blank lines keep their numbers")
	require.JSONEq(t, `{"id": 4, "nested": {"k": [1, 2]}}`, string(recs[3].JSON))
	require.Equal(t, "up/1/d.jsonl", recs[4].ObjectKey)
	for _, r := range recs {
		require.True(t, json.Valid(r.JSON))
	}
}

func TestRecordsFromFileFolder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.csv"), []byte("k,v\n1,x\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sub", "b.ndjson"), []byte(`{"k":2}`+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "_SUCCESS"), nil, 0o644))
	recs, err := readAll(t, "file://"+dir)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Equal(t, dir+"/a.csv", recs[0].ObjectKey)
	require.Equal(t, dir+"/sub/b.ndjson", recs[1].ObjectKey)
}

func TestRecordsRefuseBadData(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, file, content, want string
	}{
		{"ragged csv", "a.csv", "a,b\n1,2\n3\n", "line 3"},
		{"bare quote", "a.csv", "a,b\n1,\"x\"y\n", "line 2"},
		{"empty header", "a.csv", "a,,c\n1,2,3\n", "header column 2 is empty"},
		{"repeated header", "a.csv", "a,a\n1,2\n", `"a" repeated`},
		{"no header", "a.csv", "", "no header row"},
		{"invalid utf-8 value", "a.csv", "a\n\xff\n", "invalid UTF-8"},
		{"nul in csv", "a.csv", "a\nx\x00y\n", "NUL"},
		{"ndjson not an object", "a.ndjson", "{\"a\":1}\n[1,2]\n", "line 2: not a JSON object"},
		{"ndjson broken", "a.ndjson", "{\"a\":\n", "line 1"},
		{"ndjson nul escape", "a.ndjson", `{"a":"\u0000"}`, "NUL"},
	}
	for i, tt := range cases {
		bucket := fmt.Sprintf("bad-data-%d", i)
		writeMem(t, bucket, map[string]string{"f/" + tt.file: tt.content})
		_, err := readAll(t, "mem://"+bucket+"/f")
		require.ErrorIs(t, err, ErrMalformed, tt.name)
		require.ErrorContains(t, err, tt.want, tt.name)
	}

	// A key this project does not read fails its folder, a marker too,
	// on every scheme (S3's listing: TestS3FolderWithAControlCharacterKey).
	writeMem(t, "bad-keys", map[string]string{"f/a.csv": "a\n1\n", "f/b\x1b[2J.csv": "a\n1\n", "g/a.csv": "a\n1\n", "g/_SUCCESS\u0085": ""})
	_, err := readAll(t, "mem://bad-keys/f")
	require.ErrorIs(t, err, ErrUnreadableKey)
	require.ErrorContains(t, err, `"f/b\x1b[2J.csv" holds a control character (U+001B)`)
	_, err = readAll(t, "mem://bad-keys/g")
	require.ErrorContains(t, err, `"g/_SUCCESS\u0085" holds a control character (U+0085)`)

	writeMem(t, "bad-objects", map[string]string{"f/data.parquet": "x", "g/_SUCCESS": ""})
	_, err = readAll(t, "mem://bad-objects/f")
	require.ErrorIs(t, err, ErrUnsupportedObject)
	_, err = readAll(t, "mem://bad-objects/g")
	require.ErrorIs(t, err, ErrEmpty, "markers alone are not data")
	_, err = readAll(t, "mem://bad-objects/missing")
	require.ErrorIs(t, err, ErrEmpty)
	_, err = readAll(t, "file://"+t.TempDir()+"/does/not/exist")
	require.Error(t, err)
}

func TestRecordsAreStreamed(t *testing.T) {
	t.Parallel()
	// A long NDJSON line over the bound is refused rather than buffered.
	writeMem(t, "long-line", map[string]string{"f/a.ndjson": `{"a":"` + strings.Repeat("x", MaxRecordBytesDefault) + `"}`})
	_, err := readAll(t, "mem://long-line/f")
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "longer than")
}

func TestIsMarker(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"_SUCCESS", "a/_SUCCESS", "a/manifest.json", "a/MANIFEST.JSON", "a/.keep", "a/_tmp", "_temporary/0/part.csv", "a/.git/x.csv"} {
		require.True(t, IsMarker(k), k)
	}
	for _, k := range []string{"a.csv", "a/b_c.csv", "a/x.manifest.json"} {
		require.False(t, IsMarker(k), k)
	}
}
