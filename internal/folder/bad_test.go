package folder

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readTolerant reads every record of a mem folder holding files, skipping
// up to tolerance bad records.
func readTolerant(t *testing.T, tolerance int, files map[string]string) ([]Record, []BadRecord, error) {
	t.Helper()
	return readWith(t, Limits{}, tolerance, files)
}

// threeBad is a folder of 7 records, 3 of them bad: a CSV row with a field
// too few (line 3), a CSV value holding NUL (line 5, column 2) and an
// NDJSON line that is not a JSON object and holds 5 KiB of text (line 2).
var threeBad = map[string]string{
	"f/a.csv":    "id,note\n1,ok\n2\n3,fine\n4,bad\x00value\n5,last\n",
	"f/b.ndjson": "{\"id\":6}\n" + "not json " + strings.Repeat("x", 5<<10) + "\n{\"id\":7}\n",
}

// TestBadRecordsReportedAndToleratedUpToTheLimit: a bad record names its
// object, line, column and reason with an escaped excerpt of at most 1 KiB;
// with no tolerance the first fails the read, as before; with a tolerance
// of 5 the three are skipped (listed by Bad, in order) and every good
// record is read once; with a tolerance of 2 the third fails the read,
// naming it and how many were tolerated.
func TestBadRecordsReportedAndToleratedUpToTheLimit(t *testing.T) {
	t.Parallel()
	_, _, err := readTolerant(t, 0, threeBad)
	require.ErrorIs(t, err, ErrMalformed)
	first, ok := AsBadRecord(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, BadRecord{ObjectKey: "f/a.csv", Line: 3, Reason: "1 fields, the header has 2", Excerpt: `"2"`}, *first)
	require.Contains(t, err.Error(), "f/a.csv: line 3: 1 fields, the header has 2")

	recs, bad, err := readTolerant(t, 5, threeBad)
	require.NoError(t, err)
	var ids []string
	for _, r := range recs {
		ids = append(ids, fmt.Sprintf("%s:%d", r.ObjectKey, r.Line))
	}
	require.Equal(t, []string{"f/a.csv:2", "f/a.csv:4", "f/a.csv:6", "f/b.ndjson:1", "f/b.ndjson:3"}, ids, "every good record once, none of the bad")
	require.Len(t, bad, 3)
	require.Equal(t, BadRecord{ObjectKey: "f/a.csv", Line: 5, Column: 2, Reason: `column "note": NUL characters cannot be stored`, Excerpt: `"bad\x00value"`}, bad[1])
	require.Equal(t, "f/b.ndjson", bad[2].ObjectKey)
	require.EqualValues(t, 2, bad[2].Line)
	require.Zero(t, bad[2].Column)
	require.Equal(t, "not a JSON object", bad[2].Reason)
	require.LessOrEqual(t, len(bad[2].Excerpt), MaxExcerptBytes)
	require.True(t, strings.HasPrefix(bad[2].Excerpt, `"not json xxx`), bad[2].Excerpt)
	require.True(t, strings.HasSuffix(bad[2].Excerpt, fmt.Sprintf("… (%d bytes)", 9+5<<10)), bad[2].Excerpt)

	_, bad, err = readTolerant(t, 2, threeBad)
	var tooMany *TooManyBadRecordsError
	require.ErrorAs(t, err, &tooMany)
	require.Equal(t, 2, tooMany.Tolerated)
	require.Len(t, bad, 2)
	third, _ := AsBadRecord(err)
	require.Equal(t, "f/b.ndjson", third.ObjectKey)
	require.Contains(t, err.Error(), "3 bad records, more than the 2 tolerated")
	require.LessOrEqual(t, len(err.Error()), 2*MaxExcerptBytes, "never the whole line")
}

// TestWhatMakesAnObjectUnreadableIsNotTolerated: a record over the size
// bound leaves the rest of its object unreadable, so it fails the read
// whatever the tolerance.
func TestWhatMakesAnObjectUnreadableIsNotTolerated(t *testing.T) {
	t.Parallel()
	_, err := readLimited(t, Limits{MaxRecordBytes: 1024}, map[string]string{"f/a.csv": "id\n" + strings.Repeat("x", 2000) + "\n"})
	require.Error(t, err)
	_, _, err = readTolerant(t, 5, map[string]string{"f/a.csv": "id\n" + strings.Repeat("x", 17<<20) + "\n"})
	require.ErrorIs(t, err, ErrMalformed)
	_, isBad := AsBadRecord(err)
	require.False(t, isBad, "a record over the bound is not a skippable bad record: %v", err)
}

func TestExcerptEscapesAndBounds(t *testing.T) {
	t.Parallel()
	require.Equal(t, `"a\"b'c\n\x00\xff"`, Excerpt([]byte("a\"b'c\n\x00\xff")))
	require.Equal(t, `"日本"`, Excerpt([]byte("日本")))
	long := Excerpt([]byte(strings.Repeat("\x01", 4096)))
	require.LessOrEqual(t, len(long), MaxExcerptBytes)
	require.True(t, strings.HasSuffix(long, "… (4096 bytes)"))
}

// TestRejectCountsAgainstTheTolerance: a record the caller rejects after
// reading it (a warehouse's own limit) is a bad record of the reader: it
// is listed with the reader's own while the tolerance lasts, and the one
// past it ends the read (Err, Next false) with TooManyBadRecordsError.
func TestRejectCountsAgainstTheTolerance(t *testing.T) {
	t.Parallel()
	bucket := fmt.Sprintf("bad-%d", limitsBucketSeq.Add(1))
	writeMem(t, bucket, map[string]string{"f/a.csv": "id\n1\n2\n3\n4\n"})
	ctx := context.Background()
	f, err := Canonicalize("mem://" + bucket + "/f")
	require.NoError(t, err)
	src, err := Opener{}.Open(ctx, f)
	require.NoError(t, err)
	defer src.Close()
	src.Tolerate(1)
	objs, err := src.Objects(ctx)
	require.NoError(t, err)
	rr := src.Records(ctx, objs)
	defer rr.Close()
	var kept []int64
	for rr.Next() {
		r := rr.Record()
		if r.Line == 2 || r.Line == 4 {
			if err := rr.Reject(&BadRecord{ObjectKey: r.ObjectKey, Line: r.Line, Reason: "too deep", Excerpt: Excerpt(r.JSON)}); err != nil {
				var tooMany *TooManyBadRecordsError
				require.ErrorAs(t, err, &tooMany)
				require.Equal(t, int64(4), tooMany.Bad.Line)
				require.Equal(t, 1, tooMany.Tolerated)
				continue
			}
			continue
		}
		kept = append(kept, r.Line)
	}
	require.Equal(t, []int64{3}, kept, "the rejected record is skipped; the read ends at the one past the tolerance")
	var tooMany *TooManyBadRecordsError
	require.ErrorAs(t, rr.Err(), &tooMany, "Err reports the end")
	require.Len(t, rr.Bad(), 1)
	require.Equal(t, int64(2), rr.Bad()[0].Line)
	require.Equal(t, "too deep", rr.Bad()[0].Reason)
}
