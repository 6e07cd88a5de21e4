package reconcile

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"hash"
	"slices"
	"strings"
	"time"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
)

// MaxChangedKeys bounds the keys a re-imported folder's report and log
// name (Change.Keys): the newest objects of the folder modified after its
// load.
const MaxChangedKeys = 20

// Reasons a published folder is imported again (Change.Reason, the reason
// label of ingest_reconcile_changed_total). One folder has one reason, the
// first that holds in this order.
const (
	// ReasonAdded: the folder holds more data objects than the load read.
	ReasonAdded = "added"
	// ReasonRemoved: it holds fewer.
	ReasonRemoved = "removed"
	// ReasonChanged: as many, but not the same keys and ETags (an object
	// rewritten, or one replaced by another).
	ReasonChanged = "changed"
	// ReasonMarkerRewritten: the same objects, but the completion marker
	// was written after the one the load saw (the producer completed the
	// folder again), or written at all when the load saw none.
	ReasonMarkerRewritten = "marker_rewritten"
)

// ChangeReasons are the reasons of a change, in the order they are tried.
var ChangeReasons = []string{ReasonAdded, ReasonRemoved, ReasonChanged, ReasonMarkerRewritten}

// Values of Folder.Compared: what a scan could say of a folder whose
// batch Succeeded.
const (
	// ComparedUnchanged: the folder holds exactly what its newest batch
	// loaded (digest, count and marker): no import.
	ComparedUnchanged = "unchanged"
	// ComparedChanged: it does not (Folder.Change says how): imported
	// again (outcome reimported).
	ComparedChanged = "changed"
	// ComparedNoSummary: its newest batch records no summary of the
	// objects it loaded (a build before the summary); not compared, not
	// imported.
	ComparedNoSummary = "no_summary"
	// ComparedPartial: this scan did not list the whole folder (it began
	// before the scan's start key, it is cut by the prefix, or the scan
	// stopped inside it); not compared this time.
	ComparedPartial = "partial"
)

// Change is how a published folder differs from what its newest batch
// loaded (Folder.Change).
type Change struct {
	Reason string `json:"reason"`
	// Keys are the folder's objects modified after the newest object the
	// load read (added or rewritten since), in key order, at most
	// MaxChangedKeys of them (the newest); KeysTruncated says that more
	// may be. For marker_rewritten, the marker. A listing cannot name a
	// removed object: ObjectsBefore and ObjectsNow count them, and the
	// warehouse ledger of the previous batch names them.
	Keys          []string `json:"keys"`
	KeysTruncated bool     `json:"keys_truncated,omitempty"`
	ObjectsBefore int64    `json:"objects_before"`
	ObjectsNow    int64    `json:"objects_now"`
	// PreviousBatchID is the Succeeded batch whose load differs.
	PreviousBatchID int64 `json:"previous_batch_id"`
}

// listedObject is an object of the listing, by key and last-modified time.
type listedObject struct {
	key      string
	modified time.Time
}

// openDir is what the listing holds under one directory, accumulated
// while the listing is inside it: a folder's keys are contiguous in S3's
// key order, so when a key outside it is listed, it is complete. Its data
// objects are digested as the worker digests its listing (folder.Digest:
// keys in order, each with its ETag), so a scan compares a folder with
// its load without holding the folder's keys.
type openDir struct {
	dir string // the directory, without its trailing "/"
	// whole is false when the scan does not list all of it: it began
	// before the scan's start key, or the prefix cuts it, or the scan
	// stopped inside it.
	whole  bool
	digest hash.Hash
	count  int64
	newest time.Time
	// recent are the MaxChangedKeys newest data objects.
	recent []listedObject
	// marker is its completion marker, once listed.
	marker *listedObject
}

func newOpenDir(dir, prefix, startAfter string) *openDir {
	whole := strings.HasPrefix(dir+"/", prefix) && !strings.HasPrefix(startAfter, dir+"/")
	return &openDir{dir: dir, whole: whole, digest: sha256.New()}
}

// add accounts for one listed object under the directory (key is the
// object's full key), as the worker's listing of the folder would: the
// marker named marker directly in it, other markers (folder.IsMarker)
// skipped, anything else data.
func (d *openDir) add(key, etag string, modified time.Time, marker string) {
	rel := key[len(d.dir)+1:]
	switch {
	case rel == marker:
		d.marker = &listedObject{key: key, modified: modified}
		return
	case folder.IsMarker(rel):
		return
	}
	// folder.Digest's lines: "key\tetag\n", in key order.
	d.digest.Write([]byte(key))
	d.digest.Write([]byte{'\t'})
	d.digest.Write([]byte(etag))
	d.digest.Write([]byte{'\n'})
	d.count++
	if modified.After(d.newest) {
		d.newest = modified
	}
	o := listedObject{key: key, modified: modified}
	if len(d.recent) < MaxChangedKeys {
		d.recent = append(d.recent, o)
		return
	}
	oldest := 0
	for i, r := range d.recent {
		if r.modified.Before(d.recent[oldest].modified) {
			oldest = i
		}
	}
	if modified.After(d.recent[oldest].modified) {
		d.recent[oldest] = o
	}
}

// touchedSince reports whether the folder's marker or any of its data
// objects was last modified at or after since.
func (d *openDir) touchedSince(since time.Time) bool {
	return since.IsZero() || !d.marker.modified.Before(since) || (!d.newest.IsZero() && !d.newest.Before(since))
}

// parseSummary reads a batch's summary of the objects it loaded; false
// when it records none.
func parseSummary(raw []byte) (batch.ObjectsSummary, bool) {
	var s batch.ObjectsSummary
	if len(raw) == 0 || string(raw) == "null" || json.Unmarshal(raw, &s) != nil || s.Digest == "" {
		return batch.ObjectsSummary{}, false
	}
	return s, true
}

// compare returns how the folder listed in d differs from the load that
// recorded sum, or nil when it does not.
func (d *openDir) compare(sum batch.ObjectsSummary, marker string) *Change {
	c := &Change{ObjectsBefore: sum.Count, ObjectsNow: d.count}
	switch digest := hex.EncodeToString(d.digest.Sum(nil)); {
	case d.count > sum.Count:
		c.Reason = ReasonAdded
	case d.count < sum.Count:
		c.Reason = ReasonRemoved
	case digest != sum.Digest:
		c.Reason = ReasonChanged
	case sum.Marker == "" || (sum.Marker == marker && sum.MarkerModified != nil && d.marker.modified.After(*sum.MarkerModified)):
		// A load that saw no marker (an import that opted out) and a
		// marker there now: written after the load.
		c.Reason, c.Keys = ReasonMarkerRewritten, []string{d.marker.key}
		return c
	default:
		return nil
	}
	c.Keys = []string{}
	newer := 0
	for _, o := range d.recent {
		if sum.NewestModified == nil || o.modified.After(*sum.NewestModified) {
			c.Keys = append(c.Keys, o.key)
			newer++
		}
	}
	slices.Sort(c.Keys)
	// Every object kept was newer, and the folder has more than were kept.
	c.KeysTruncated = newer == len(d.recent) && d.count > int64(len(d.recent))
	return c
}
