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
}

// ErrMalformedEvent is wrapped by ParseS3Event for bodies it cannot read.
var ErrMalformedEvent = errors.New("malformed storage event")

// s3Notification is the Amazon S3 event notification shape.
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
		events = append(events, ObjectEvent{Bucket: r.S3.Bucket.Name, Key: key, Created: strings.HasPrefix(r.EventName, "ObjectCreated:")})
	}
	return events, nil
}
