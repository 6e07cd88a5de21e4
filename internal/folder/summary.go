package folder

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"time"

	"github.com/fleet/ingest/internal/batch"
)

// Digest returns the hex SHA-256 of the objects' keys and ETags, one
// "key\tetag\n" line per object in key order: two listings of a folder
// digest alike exactly when they name the same objects with the same
// content (as S3's ETags tell it). It does not depend on the order of
// objects.
func Digest(objects []Object) string {
	sorted := make([]Object, len(objects))
	copy(sorted, objects)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Key < sorted[j].Key })
	h := sha256.New()
	for _, o := range sorted {
		h.Write([]byte(o.Key))
		h.Write([]byte{'\t'})
		h.Write([]byte(o.ETag))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Summarize returns the summary a load records of its listing
// (batch.Details.Objects): counts, bytes, the newest last-modified time,
// the digest, and the marker named marker with the number of objects
// modified after it (late: in a later second), when the folder holds that
// marker.
func Summarize(l Listing, marker string) batch.ObjectsSummary {
	s := batch.ObjectsSummary{Count: int64(len(l.Objects)), Digest: Digest(l.Objects)}
	var newest time.Time
	for _, o := range l.Objects {
		s.Bytes += o.Size
		if o.LastModified.After(newest) {
			newest = o.LastModified
		}
	}
	if !newest.IsZero() {
		n := newest.UTC()
		s.NewestModified = &n
	}
	if m, ok := l.Marker(marker); ok && marker != "" {
		s.Marker = marker
		if !m.LastModified.IsZero() {
			at := m.LastModified.UTC()
			s.MarkerModified = &at
			for _, o := range l.Objects {
				if later(o.LastModified, at) {
					s.Late++
				}
			}
		}
	}
	return s
}

// Late returns the keys of the objects modified after the marker named
// marker, and nil when the folder holds no such marker.
func Late(l Listing, marker string) []string {
	m, ok := l.Marker(marker)
	if !ok || m.LastModified.IsZero() {
		return nil
	}
	var late []string
	for _, o := range l.Objects {
		if later(o.LastModified, m.LastModified) {
			late = append(late, o.Key)
		}
	}
	return late
}

// later reports whether an object modified at t was modified after a
// marker modified at marker, at the precision of S3's listings (the
// second: ListObjectsV2 says ".000Z"), so that a store with a finer clock
// does not call late an object written in the marker's own second.
func later(t, marker time.Time) bool {
	return t.Truncate(time.Second).After(marker.Truncate(time.Second))
}
