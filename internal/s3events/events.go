package s3events

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ObjectEvent is one object notification extracted from a storage event.
type ObjectEvent struct {
	Bucket string
	// Key is the decoded object key.
	Key string
	// Created is true for object-created events.
	Created bool
	// Ignore is, for an event that cannot complete a folder whatever its
	// key, why: IgnoredNotCreated, IgnoredUnknownEvent or
	// IgnoredUnknownSource. It is "" for a creation (and for events made
	// by reconcile, which are creations).
	Ignore string
	// Name and Source are the record's eventName and eventSource as the
	// store sent them (an EventBridge event's detail-type and source), to
	// say why an event is ignored; empty for events made by reconcile.
	Name, Source string
}

// Why an object event completes no folder (Planned.IgnoredReason, the
// ignored_reason of the HTTP answer and the reason label of
// ingest_events_ignored_total).
const (
	// IgnoredDataObject: the creation of an object that is not its
	// folder's completion marker (a data object, or another marker).
	IgnoredDataObject = "data_object"
	// IgnoredNotCreated: an event of a kind stores send that creates no
	// object (removal, access, restore, replication, tagging, lifecycle),
	// including MinIO's ObjectCreated events that change only metadata.
	IgnoredNotCreated = "not_created"
	// IgnoredUnknownEvent: an event name no S3-compatible store is known
	// to send (a format nobody expected).
	IgnoredUnknownEvent = "unknown_event"
	// IgnoredUnknownSource: a record whose eventSource is set but is not
	// an S3 store's ("<store>:s3": aws:s3, minio:s3, ceph:s3).
	IgnoredUnknownSource = "unknown_source"
)

// IgnoredReasons are every reason an event is ignored for.
var IgnoredReasons = []string{IgnoredDataObject, IgnoredNotCreated, IgnoredUnknownEvent, IgnoredUnknownSource}

// ErrMalformedEvent is wrapped by ParseS3Event for bodies it cannot read.
var ErrMalformedEvent = errors.New("malformed storage event")

// s3Notification is the S3 event notification shape: Amazon's, and that
// of the stores that copy it (MinIO, Ceph RGW). MinIO's webhook wraps its
// records in an envelope with a top-level EventName and Key (the bucket
// and the decoded key) beside Records; only Records is read.
type s3Notification struct {
	Records []struct {
		EventSource string `json:"eventSource"`
		EventName   string `json:"eventName"`
		S3          struct {
			Bucket struct {
				Name string `json:"name"`
			} `json:"bucket"`
			Object struct {
				Key string `json:"key"`
			} `json:"object"`
		} `json:"s3"`
	} `json:"Records"`
	// Event is set on the "s3:TestEvent" sent when notifications are configured.
	Event string `json:"Event"`
}

// eventBridgeEvent is an EventBridge "Object Created" event from S3.
type eventBridgeEvent struct {
	Source     string `json:"source"`
	DetailType string `json:"detail-type"`
	Detail     struct {
		Bucket struct {
			Name string `json:"name"`
		} `json:"bucket"`
		Object struct {
			Key string `json:"key"`
		} `json:"object"`
	} `json:"detail"`
}

// ParseS3Event reads the object events of a body that is an S3 event
// notification, an SNS notification wrapping one, or an EventBridge event
// from S3. Keys in S3 notifications are URL-encoded and are decoded here
// ('+' is a space). Bodies with no object events (an s3:TestEvent, an SNS
// subscription confirmation) give none and no error. What the body is
// comes from ReadNotification, the one classification the HTTP door also
// authenticates by: of an SNS envelope only the signed Message is read.
func ParseS3Event(body []byte) ([]ObjectEvent, error) {
	n, err := ReadNotification(body)
	if err != nil {
		return nil, err
	}
	return n.Events()
}

func parseNotification(body []byte) ([]ObjectEvent, error) {
	var n s3Notification
	if err := json.Unmarshal(body, &n); err != nil {
		return nil, fmt.Errorf("%w: S3 notification: %v", ErrMalformedEvent, err)
	}
	if len(n.Records) > 1000 {
		return nil, fmt.Errorf("%w: too many records (%d)", ErrMalformedEvent, len(n.Records))
	}
	events := make([]ObjectEvent, 0, len(n.Records))
	for i, r := range n.Records {
		if r.S3.Bucket.Name == "" || r.S3.Object.Key == "" {
			return nil, fmt.Errorf("%w: record %d has no bucket or key", ErrMalformedEvent, i)
		}
		key, err := url.QueryUnescape(r.S3.Object.Key)
		if err != nil {
			return nil, fmt.Errorf("%w: record %d key: %v", ErrMalformedEvent, i, err)
		}
		created, ignore := ClassifyRecord(r.EventSource, r.EventName)
		events = append(events, ObjectEvent{Bucket: r.S3.Bucket.Name, Key: key, Created: created, Ignore: ignore,
			Name: r.EventName, Source: r.EventSource})
	}
	return events, nil
}

// eventFamilies are the first segments of the event names S3-compatible
// stores send (after the optional "s3:" prefix) that create no object:
// Amazon S3's, MinIO's and Ceph RGW's.
var eventFamilies = map[string]bool{
	"ObjectRemoved": true, "ObjectAccessed": true, "ObjectRestore": true, "ObjectTagging": true, "ObjectAcl": true,
	"ObjectTransition": true, "ObjectLifecycle": true, "ObjectSynced": true, "Replication": true,
	"LifecycleExpiration": true, "LifecycleTransition": true, "LifecycleDelMarkerExpiration": true,
	"IntelligentTiering": true, "ReducedRedundancyLostObject": true, "Scanner": true,
	"BucketCreated": true, "BucketRemoved": true,
}

// metadataOnly are MinIO's ObjectCreated events that change an object's
// metadata, not its content: they create nothing.
var metadataOnly = map[string]bool{"PutRetention": true, "PutLegalHold": true, "PutTagging": true, "DeleteTagging": true}

// ClassifyRecord reads an S3 event record's eventSource and eventName, as
// Amazon S3, MinIO and Ceph RGW write them: whether the event created its
// object, and otherwise why it cannot complete a folder (ObjectEvent.Ignore).
//
// The source is "<store>:s3" (aws:s3, minio:s3, ceph:s3, any store's
// name); a record without one is read as S3's, any other source is
// IgnoredUnknownSource. The name may carry the "s3:" prefix (MinIO's and
// older Ceph's s3:ObjectCreated:Put, Amazon's ObjectCreated:Put):
// ObjectCreated:* is a creation, but for MinIO's metadata-only
// ObjectCreated:PutTagging, DeleteTagging, PutRetention and PutLegalHold;
// the other kinds stores send (removals, access, restores, replication,
// lifecycle, …) are IgnoredNotCreated, and any other name
// IgnoredUnknownEvent.
func ClassifyRecord(source, name string) (created bool, ignore string) {
	if source != "" && !isStoreSource(source) {
		return false, IgnoredUnknownSource
	}
	name = strings.TrimPrefix(name, "s3:")
	family, kind, _ := strings.Cut(name, ":")
	switch {
	case family == "ObjectCreated" && kind != "" && !metadataOnly[kind]:
		return true, ""
	case family == "ObjectCreated" && kind != "", eventFamilies[family]:
		return false, IgnoredNotCreated
	}
	return false, IgnoredUnknownEvent
}

// isStoreSource reports whether an eventSource is an S3 store's:
// "<store>:s3", the store's name of letters, digits, '.', '-' or '_'.
func isStoreSource(source string) bool {
	store, ok := strings.CutSuffix(source, ":s3")
	if !ok || store == "" || len(store) > 64 {
		return false
	}
	for _, c := range store {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
