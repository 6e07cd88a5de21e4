package s3events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// SNS message types (SNSMessage.Type).
const (
	SNSNotification             = "Notification"
	SNSSubscriptionConfirmation = "SubscriptionConfirmation"
	SNSUnsubscribeConfirmation  = "UnsubscribeConfirmation"
)

// SNSMessage is an Amazon SNS HTTP(S) delivery (or, without raw message
// delivery, the body of an SQS message from an SNS subscription), as
// ReadNotification reads it. Verifying its signature is the HTTP door's.
type SNSMessage struct {
	Type             string
	MessageID        string
	Token            string
	TopicArn         string
	Subject          *string // signed only when present
	Message          string
	Timestamp        string
	SignatureVersion string
	Signature        string
	SigningCertURL   string
	SubscribeURL     string
}

// parseSNS reads the members of an SNS envelope strictly: each key must be
// one SNS sends, spelt exactly (encoding/json would match "type" or
// "MESSAGE" to the fields), and each value a string (MessageAttributes an
// object, Subject possibly null). Anything else is refused, so nothing the
// signature does not cover can ride along with a signed message.
func parseSNS(members []jsonMember) (SNSMessage, error) {
	var m SNSMessage
	fields := map[string]*string{
		"Type": &m.Type, "MessageId": &m.MessageID, "Token": &m.Token, "TopicArn": &m.TopicArn,
		"Message": &m.Message, "Timestamp": &m.Timestamp, "SignatureVersion": &m.SignatureVersion,
		"Signature": &m.Signature, "SigningCertURL": &m.SigningCertURL, "SubscribeURL": &m.SubscribeURL,
		"UnsubscribeURL": new(string),
	}
	for _, member := range members {
		switch field, ok := fields[member.name]; {
		case ok:
			if err := json.Unmarshal(member.value, field); err != nil || member.value[0] != '"' {
				return SNSMessage{}, fmt.Errorf("%s must be a string", member.name)
			}
		case member.name == "Subject":
			if string(member.value) == "null" {
				continue
			}
			var subject string
			if err := json.Unmarshal(member.value, &subject); err != nil || member.value[0] != '"' {
				return SNSMessage{}, errors.New("the Subject must be a string")
			}
			m.Subject = &subject
		case member.name == "MessageAttributes":
			// Unsigned and never read: an object, or nothing at all.
			if member.value[0] != '{' {
				return SNSMessage{}, errors.New("MessageAttributes must be an object")
			}
		default:
			return SNSMessage{}, fmt.Errorf("unknown key %q: an SNS envelope carries only SNS's own fields, spelt exactly", member.name)
		}
	}
	switch m.Type {
	case SNSNotification, SNSSubscriptionConfirmation, SNSUnsubscribeConfirmation:
	default:
		return SNSMessage{}, fmt.Errorf("unknown SNS message type %q", m.Type)
	}
	return m, nil
}

// StringToSign is the canonical text SNS signs: name, newline, value,
// newline, for a fixed list of fields in byte order, which differs between
// notifications and (un)subscription confirmations.
func (m SNSMessage) StringToSign() (string, error) {
	var b strings.Builder
	add := func(name, value string) { b.WriteString(name + "\n" + value + "\n") }
	switch m.Type {
	case SNSNotification:
		add("Message", m.Message)
		add("MessageId", m.MessageID)
		if m.Subject != nil {
			add("Subject", *m.Subject)
		}
		add("Timestamp", m.Timestamp)
		add("TopicArn", m.TopicArn)
		add("Type", m.Type)
	case SNSSubscriptionConfirmation, SNSUnsubscribeConfirmation:
		add("Message", m.Message)
		add("MessageId", m.MessageID)
		add("SubscribeURL", m.SubscribeURL)
		add("Timestamp", m.Timestamp)
		add("Token", m.Token)
		add("TopicArn", m.TopicArn)
		add("Type", m.Type)
	default:
		return "", fmt.Errorf("unknown SNS message type %q", m.Type)
	}
	return b.String(), nil
}
