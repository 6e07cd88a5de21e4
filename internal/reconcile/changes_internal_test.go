package reconcile

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
)

// TestOpenDirDigestsAsTheWorker: what a scan accumulates for a folder
// while listing it (in key order, markers and nested keys among its data)
// digests and counts exactly what folder.Summarize records of the worker's
// listing of it, so an unchanged folder compares equal; a rewritten ETag
// does not.
func TestOpenDirDigestsAsTheWorker(t *testing.T) {
	t.Parallel()
	const dir = "tenants/t/db/c/up"
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	listed := []folder.Object{ // S3's key order
		{Key: dir + "/.hidden", ETag: "h"},
		{Key: dir + "/0-first.csv", ETag: "e0", LastModified: at},
		{Key: dir + "/_SUCCESS", ETag: "m", LastModified: at.Add(time.Second)},
		{Key: dir + "/_logs/run.txt", ETag: "l"},
		{Key: dir + "/part-1.csv", ETag: "e1", LastModified: at},
		{Key: dir + "/sub/part-2.ndjson", ETag: "e2", LastModified: at.Add(2 * time.Second)},
	}
	var l folder.Listing
	d := newOpenDir(dir, "tenants/", "")
	for _, o := range listed {
		d.add(o.Key, o.ETag, o.LastModified, "_SUCCESS")
		if rel := o.Key[len(dir)+1:]; folder.IsMarker(rel) {
			l.Markers = append(l.Markers, folder.Object{Key: rel, ETag: o.ETag, LastModified: o.LastModified})
		} else {
			l.Objects = append(l.Objects, o)
		}
	}
	require.True(t, d.whole)
	require.NotNil(t, d.marker)
	sum := folder.Summarize(l, "_SUCCESS")
	require.EqualValues(t, 3, sum.Count)
	require.Nil(t, d.compare(sum, "_SUCCESS"), "the same objects compare equal")

	changed := newOpenDir(dir, "", "")
	for _, o := range listed {
		if o.Key == dir+"/part-1.csv" {
			o.ETag, o.LastModified = "e1-new", at.Add(time.Minute)
		}
		changed.add(o.Key, o.ETag, o.LastModified, "_SUCCESS")
	}
	c := changed.compare(sum, "_SUCCESS")
	require.Equal(t, &Change{Reason: ReasonChanged, Keys: []string{dir + "/part-1.csv"}, ObjectsBefore: 3, ObjectsNow: 3}, c)

	// Begun before the scan's start key, or cut by the prefix: not whole.
	require.False(t, newOpenDir(dir, "", dir+"/0-first.csv").whole)
	require.False(t, newOpenDir(dir, dir+"/part", "").whole)
}

// TestChangedKeysAreBounded: a folder that gained more objects than
// MaxChangedKeys names the newest MaxChangedKeys, in key order, and says
// that more may have changed.
func TestChangedKeysAreBounded(t *testing.T) {
	t.Parallel()
	const dir = "tenants/t/db/c/up"
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	loaded := at
	sum := batch.ObjectsSummary{Count: 1, Digest: "whatever", NewestModified: &loaded, Marker: "_SUCCESS", MarkerModified: &loaded}
	d := newOpenDir(dir, "", "")
	d.add(dir+"/_SUCCESS", "m", at, "_SUCCESS")
	d.add(dir+"/a-old.csv", "e", at, "_SUCCESS")
	var newest []string
	for i := range MaxChangedKeys + 5 {
		k := fmt.Sprintf("%s/b-%02d.csv", dir, i)
		d.add(k, "e", at.Add(time.Duration(i+1)*time.Second), "_SUCCESS")
		if i >= 5 {
			newest = append(newest, k)
		}
	}
	c := d.compare(sum, "_SUCCESS")
	require.Equal(t, ReasonAdded, c.Reason)
	require.True(t, c.KeysTruncated)
	require.True(t, slices.IsSorted(c.Keys))
	require.Equal(t, newest, c.Keys, "the newest MaxChangedKeys")
	require.EqualValues(t, MaxChangedKeys+6, c.ObjectsNow)
}
