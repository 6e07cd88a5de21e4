package s3events

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzParseS3Event feeds arbitrary bodies to the event parser: it must never
// panic, and every failure must wrap ErrMalformedEvent. The seed corpus runs
// in every normal test run.
func FuzzParseS3Event(f *testing.F) {
	for _, s := range []string{
		string(s3Event("b", "tenants/t/d/c/x/_SUCCESS", "ObjectCreated:Put")),
		`{"Type":"Notification","Message":"{\"Records\":[]}"}`,
		`{"source":"aws.s3","detail-type":"Object Created","detail":{"bucket":{"name":"b"},"object":{"key":"k"}}}`,
		`{"Event":"s3:TestEvent"}`, `{}`, `[]`, `null`, `{"Records":null}`, `{"Records":[{}]}`,
		`{"Type":"Notification","Message":"\u0000"}`, `{"detail-type":1}`,
		minioWebhookBody, cephRecord("s3:ObjectCreated:Put"), `{"EventName":1,"Key":null,"Records":[]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		events, err := ParseS3Event(body)
		if err != nil {
			if !errors.Is(err, ErrMalformedEvent) {
				t.Fatalf("error does not wrap ErrMalformedEvent: %v", err)
			}
			return
		}
		for _, e := range events {
			if e.Bucket == "" || e.Key == "" {
				t.Fatalf("event without bucket or key: %+v", e)
			}
		}
	})
}

// s3Event is an S3 event notification of one record.
func s3Event(bucket, key, eventName string) []byte {
	b, _ := json.Marshal(map[string]any{"Records": []any{map[string]any{
		"eventVersion": "2.1", "eventSource": "aws:s3", "eventName": eventName,
		"s3": map[string]any{"bucket": map[string]any{"name": bucket}, "object": map[string]any{"key": key, "size": 0}},
	}}})
	return b
}
