package s3events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// notificationKind is what a notification body is.
type notificationKind int

const (
	kindS3Notification notificationKind = iota + 1
	kindSNS
	kindEventBridge
)

func (k notificationKind) String() string {
	switch k {
	case kindS3Notification:
		return "an S3 notification"
	case kindSNS:
		return "an SNS envelope"
	case kindEventBridge:
		return "an EventBridge event"
	}
	return "nothing known"
}

// maxTopLevelKeys bounds the members of a notification body's top-level
// object: S3, SNS and EventBridge send at most a dozen.
const maxTopLevelKeys = 32

// Notification is a notification body (of the HTTP door's /v1/events/s3,
// or of an SQS message), classified once: the door authenticates it (SNS)
// and reads its object events (Events) from the same value, so the part
// that is authenticated is the part that is imported. Only
// ReadNotification makes one.
type Notification struct {
	kind notificationKind
	body []byte
	// sns is the envelope of kindSNS: only its signed Message is imported,
	// never a sibling field.
	sns SNSMessage
}

// SNS returns the envelope of a body that is an SNS envelope (a
// Notification or a control message), and whether n is one.
func (n Notification) SNS() (SNSMessage, bool) {
	return n.sns, n.kind == kindSNS
}

// jsonMember is one member of a JSON object, in body order.
type jsonMember struct {
	name  string
	value json.RawMessage
}

// ReadNotification classifies body by its top-level keys, which must be
// unambiguous: a key folding to "type" makes it an SNS envelope, "Records"
// or "Event" an S3 notification, "detail-type" an EventBridge event, and a
// body naming two of these is refused. Keys are compared case-insensitively
// here because encoding/json matches struct tags that way: a body cannot
// hide one kind's key from this classification by its spelling. Duplicate
// top-level keys (in any spelling) and data after the object are refused.
// An SNS envelope is then read strictly (parseSNS): exact key names, no
// unknown key. Errors wrap ErrMalformedEvent.
func ReadNotification(body []byte) (Notification, error) {
	members, err := topLevelMembers(body)
	if err != nil {
		return Notification{}, fmt.Errorf("%w: %v", ErrMalformedEvent, err)
	}
	var kinds []notificationKind
	mark := func(k notificationKind) {
		for _, have := range kinds {
			if have == k {
				return
			}
		}
		kinds = append(kinds, k)
	}
	for _, m := range members {
		switch {
		case strings.EqualFold(m.name, "Type"):
			mark(kindSNS)
		case strings.EqualFold(m.name, "Records"), strings.EqualFold(m.name, "Event"):
			mark(kindS3Notification)
		case strings.EqualFold(m.name, "detail-type"):
			mark(kindEventBridge)
		}
	}
	switch len(kinds) {
	case 0:
		return Notification{}, fmt.Errorf("%w: neither an S3 notification, an SNS envelope nor an EventBridge event", ErrMalformedEvent)
	case 1:
	default:
		return Notification{}, fmt.Errorf("%w: ambiguous body: both %s and %s", ErrMalformedEvent, kinds[0], kinds[1])
	}
	n := Notification{kind: kinds[0], body: body}
	if n.kind == kindSNS {
		if n.sns, err = parseSNS(members); err != nil {
			return Notification{}, fmt.Errorf("%w: SNS envelope: %v", ErrMalformedEvent, err)
		}
	}
	return n, nil
}

// topLevelMembers walks the top-level object of body with a token decoder
// (so that duplicates are seen, which json.Unmarshal would merge) and
// returns its members in order.
func topLevelMembers(body []byte) ([]jsonMember, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("the body is not a JSON object")
	}
	var members []jsonMember
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := tok.(string) // object keys are always strings
		for _, m := range members {
			if strings.EqualFold(m.name, name) {
				return nil, fmt.Errorf("duplicate key %q", name)
			}
		}
		if len(members) == maxTopLevelKeys {
			return nil, fmt.Errorf("more than %d top-level keys", maxTopLevelKeys)
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, err
		}
		members = append(members, jsonMember{name: name, value: value})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON object")
	}
	return members, nil
}

// Events returns the object events of n. An SNS notification gives the
// events of its signed Message (an S3 notification); other SNS messages
// (subscription confirmations) give none.
func (n Notification) Events() ([]ObjectEvent, error) {
	switch n.kind {
	case kindS3Notification:
		return parseNotification(n.body)
	case kindSNS:
		if n.sns.Type != SNSNotification {
			return nil, nil
		}
		return parseNotification([]byte(n.sns.Message))
	case kindEventBridge:
		var ev eventBridgeEvent
		if err := json.Unmarshal(n.body, &ev); err != nil {
			return nil, fmt.Errorf("%w: EventBridge event: %v", ErrMalformedEvent, err)
		}
		if ev.Source != "aws.s3" {
			return nil, fmt.Errorf("%w: EventBridge source %q is not aws.s3", ErrMalformedEvent, ev.Source)
		}
		if ev.Detail.Bucket.Name == "" || ev.Detail.Object.Key == "" {
			return nil, fmt.Errorf("%w: EventBridge event without bucket or key", ErrMalformedEvent)
		}
		// EventBridge keys are not URL-encoded.
		e := ObjectEvent{Bucket: ev.Detail.Bucket.Name, Key: ev.Detail.Object.Key, Created: ev.DetailType == "Object Created",
			Name: ev.DetailType, Source: ev.Source}
		if !e.Created {
			e.Ignore = IgnoredNotCreated
		}
		return []ObjectEvent{e}, nil
	}
	return nil, fmt.Errorf("%w: unknown notification kind", ErrMalformedEvent)
}
