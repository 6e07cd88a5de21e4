package sqstest

import (
	"encoding/json"
	"net/url"
	"strings"
	"time"
)

// The bodies S3 notifications arrive in, as the AWS services send them, for
// tests to put on a queue.

// S3Event is an S3 event notification of one object created (the body of
// a direct bucket notification, or of SNS with raw message delivery). The
// key is URL-encoded as S3 encodes it.
func S3Event(bucket, key string) string {
	enc := strings.ReplaceAll(url.QueryEscape(key), "%2F", "/")
	b, _ := json.Marshal(map[string]any{"Records": []any{map[string]any{
		"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": Region,
		"eventTime": time.Now().UTC().Format(time.RFC3339Nano), "eventName": "ObjectCreated:Put",
		"s3": map[string]any{
			"s3SchemaVersion": "1.0", "configurationId": "fleet-uploads",
			"bucket": map[string]any{"name": bucket, "arn": "arn:aws:s3:::" + bucket},
			"object": map[string]any{"key": enc, "size": 0, "sequencer": "0055AED6DCD90281E5"},
		},
	}}})
	return string(b)
}

// S3Events is an S3 event notification of several objects created (S3
// sends one record per object; a notification may hold several).
func S3Events(bucket string, keys ...string) string {
	var records []any
	for _, k := range keys {
		var one map[string][]any
		_ = json.Unmarshal([]byte(S3Event(bucket, k)), &one)
		records = append(records, one["Records"]...)
	}
	b, _ := json.Marshal(map[string]any{"Records": records})
	return string(b)
}

// TestEvent is the s3:TestEvent S3 sends when a bucket's notifications are
// configured.
func TestEvent(bucket string) string {
	b, _ := json.Marshal(map[string]any{
		"Service": "Amazon S3", "Event": "s3:TestEvent", "Time": time.Now().UTC().Format(time.RFC3339Nano),
		"Bucket": bucket, "RequestId": "5582815E1AEA5ADF", "HostId": "8cLeGAmw098X5cv4Zkwcmo8vvZa3eH3eKxsPzbB9wrR+YstdA6Knx4Ip8EXAMPLE",
	})
	return string(b)
}

// SNSEnvelope wraps message as an SNS topic delivers it to an SQS queue
// without raw message delivery. The signature fields are present but not
// valid signatures: the consumer does not verify them.
func SNSEnvelope(message string) string {
	return snsEnvelope("Notification", message)
}

// SNSSubscriptionConfirmation is the message SNS sends to a queue of
// another account when it is subscribed to a topic.
func SNSSubscriptionConfirmation() string {
	return snsEnvelope("SubscriptionConfirmation", "You have chosen to subscribe to the topic arn:aws:sns:us-east-1:123456789012:fleet-uploads.")
}

func snsEnvelope(typ, message string) string {
	m := map[string]any{
		"Type": typ, "MessageId": "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
		"TopicArn": "arn:aws:sns:us-east-1:123456789012:fleet-uploads", "Subject": "Amazon S3 Notification",
		"Message": message, "Timestamp": time.Now().UTC().Format(time.RFC3339Nano), "SignatureVersion": "1",
		"Signature":      "EXAMPLEpH+DcEwjAPg8O9mY8dReBSwksfg2S7WKQcikcNKWLQjwu6A4VbeS0QHVCkhRS7fUQvi2egU3N858fiTDN6bkkOxYDVrY0Ad8L10Hs3zH81mtnPk5uvvolIC1CXGu43obcgFxeL3khZl8IKvO61GWB6jI9b5+gLPoBc1Q=",
		"SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0000000000000000000000.pem",
		"UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=arn:aws:sns:us-east-1:123456789012:fleet-uploads:c9135db0",
	}
	if typ != "Notification" {
		delete(m, "Subject")
		delete(m, "UnsubscribeURL")
		m["Token"] = "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a988666d92768dd60a747ba6f3beb71854e285d6ad02428b09ceece29417f1f02d609c582afbacc99c583a916b9981dd2728f4ae6fdb82efd087cc3b7849e05798d2d2785c03b0879594eeac82c01f235d0e717736"
		m["SubscribeURL"] = "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:us-east-1:123456789012:fleet-uploads&Token=2336412f"
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// EventBridgeObjectCreated is an EventBridge "Object Created" event from
// S3, as an EventBridge rule with an SQS target delivers it.
func EventBridgeObjectCreated(bucket, key string) string {
	b, _ := json.Marshal(map[string]any{
		"version": "0", "id": "17793124-05d4-b198-2fde-7ededc63b103", "detail-type": "Object Created",
		"source": "aws.s3", "account": "123456789012", "time": time.Now().UTC().Format(time.RFC3339), "region": Region,
		"resources": []string{"arn:aws:s3:::" + bucket},
		"detail": map[string]any{
			"version": "0", "bucket": map[string]any{"name": bucket},
			"object":     map[string]any{"key": key, "size": 0, "etag": "d41d8cd98f00b204e9800998ecf8427e", "sequencer": "00617F08299329D189"},
			"request-id": "N4N7GDK58NMKJ12R", "requester": "123456789012", "reason": "PutObject",
		},
	})
	return string(b)
}
