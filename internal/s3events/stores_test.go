package s3events

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/folder"
)

// minioWebhookBody is a body as MinIO's webhook target posts it: its
// envelope (EventName, Key: the bucket and the decoded key, Records) around
// one S3 event record of MinIO's (event name with the s3: prefix, source
// minio:s3, no region, the key escaped as a form value: '/' as %2F, ' '
// as '+').
const minioWebhookBody = `{"EventName":"s3:ObjectCreated:Put","Key":"fleet-uploads/tenants/t1/db1/c1/up 1/_SUCCESS","Records":[{
	"eventVersion":"2.0","eventSource":"minio:s3","awsRegion":"","eventTime":"2026-12-06T03:00:00.000Z",
	"eventName":"s3:ObjectCreated:Put","userIdentity":{"principalId":"miniotest"},
	"requestParameters":{"principalId":"miniotest","region":"","sourceIPAddress":"127.0.0.1"},
	"responseElements":{"x-amz-id-2":"dd9025bab4ad464b","x-amz-request-id":"182178E8B36AC9DF","x-minio-deployment-id":"2369dcb4","x-minio-origin-endpoint":"http://127.0.0.1:9000"},
	"s3":{"s3SchemaVersion":"1.0","configurationId":"Config","bucket":{"name":"fleet-uploads","ownerIdentity":{"principalId":"miniotest"},"arn":"arn:aws:s3:::fleet-uploads"},
	"object":{"key":"tenants%2Ft1%2Fdb1%2Fc1%2Fup+1%2F_SUCCESS","size":0,"eTag":"d41d8cd98f00b204e9800998ecf8427e","contentType":"application/octet-stream","userMetadata":{"content-type":"application/octet-stream"},"sequencer":"182178E8B3A1C2D4"}},
	"source":{"host":"127.0.0.1","port":"","userAgent":"aws-sdk-go-v2"}}]}`

// cephRecord is an S3 event notification of Ceph RGW's HTTP endpoint: its
// eventSource ceph:s3, its object size a string, the event name with or
// without the s3: prefix (by release).
func cephRecord(eventName string) string {
	return `{"Records":[{"eventVersion":"2.2","eventSource":"ceph:s3","awsRegion":"default","eventTime":"2026-12-06T03:00:00.124724Z",
	"eventName":"` + eventName + `","userIdentity":{"principalId":"tester"},"requestParameters":{"sourceIPAddress":""},
	"responseElements":{"x-amz-request-id":"503a4c37.5330.903595","x-amz-id-2":"14d2-zone1-zonegroup1"},
	"s3":{"s3SchemaVersion":"1.0","configurationId":"fleet","bucket":{"name":"fleet-uploads","ownerIdentity":{"principalId":"tester"},"arn":"arn:aws:s3:default::fleet-uploads","id":"503a4c37.5332.38"},
	"object":{"key":"tenants/t1/db1/c1/up-2/_SUCCESS","size":"0","eTag":"d41d8cd98f00b204e9800998ecf8427e","versionId":"","sequencer":"F7E6D75DC742D108","metadata":[],"tags":[]}},
	"eventId":"1575221657.102001.80dad3aad8584778352c68ea467a8d85","opaqueData":""}]}`
}

// TestS3CompatibleStoresCompleteFolders: the records of MinIO's webhook and
// of Ceph RGW complete a folder as Amazon's do; each event that completes
// none is ignored for a reason, the unexpected ones (an unknown event name
// or source) as such.
func TestS3CompatibleStoresCompleteFolders(t *testing.T) {
	t.Parallel()
	m := folder.Mapping{Pattern: "tenants/{tenant_id}/{tenant_database}/{company_id}/"}
	plan := func(t *testing.T, body string) Planned {
		t.Helper()
		events, err := ParseS3Event([]byte(body))
		require.NoError(t, err)
		require.Len(t, events, 1)
		plans := PlanEvents(events, "_SUCCESS", m)
		require.Len(t, plans, 1)
		return plans[0]
	}
	for name, c := range map[string]struct{ body, folder string }{
		"minio webhook":      {minioWebhookBody, "s3://fleet-uploads/tenants/t1/db1/c1/up 1"},
		"ceph":               {cephRecord("ObjectCreated:Put"), "s3://fleet-uploads/tenants/t1/db1/c1/up-2"},
		"ceph, s3: prefix":   {cephRecord("s3:ObjectCreated:CompleteMultipartUpload"), "s3://fleet-uploads/tenants/t1/db1/c1/up-2"},
		"amazon":             {string(s3Event("fleet-uploads", "tenants/t1/db1/c1/up-3/_SUCCESS", "ObjectCreated:Copy")), "s3://fleet-uploads/tenants/t1/db1/c1/up-3"},
		"amazon, no source":  {`{"Records":[{"eventName":"ObjectCreated:Post","s3":{"bucket":{"name":"fleet-uploads"},"object":{"key":"tenants/t1/db1/c1/up-4/_SUCCESS"}}}]}`, "s3://fleet-uploads/tenants/t1/db1/c1/up-4"},
		"minio, via sns":     {snsWrapped(t, minioWebhookBody), "s3://fleet-uploads/tenants/t1/db1/c1/up 1"},
		"other store's name": {record("seaweedfs:s3", "s3:ObjectCreated:Put", "tenants/t1/db1/c1/up-5/_SUCCESS"), "s3://fleet-uploads/tenants/t1/db1/c1/up-5"},
	} {
		p := plan(t, c.body)
		require.Empty(t, p.Outcome, "%s: %+v", name, p)
		require.Equal(t, c.folder, p.Request.Folder, name)
		require.Equal(t, "t1", p.Request.TenantID, name)
	}

	const marker = "tenants/t1/db1/c1/up-9/_SUCCESS"
	for name, c := range map[string]struct{ body, reason, says string }{
		"minio data object":      {record("minio:s3", "s3:ObjectCreated:Put", "tenants/t1/db1/c1/up-9/trips.csv"), IgnoredDataObject, "not the folder's completion marker"},
		"another marker":         {record("aws:s3", "ObjectCreated:Put", "tenants/t1/db1/c1/up-9/_temporary/0/x"), IgnoredDataObject, "_SUCCESS"},
		"minio removal":          {record("minio:s3", "s3:ObjectRemoved:Delete", marker), IgnoredNotCreated, `"s3:ObjectRemoved:Delete" creates no object`},
		"minio tagging":          {record("minio:s3", "s3:ObjectCreated:PutTagging", marker), IgnoredNotCreated, "creates no object"},
		"minio access":           {record("minio:s3", "s3:ObjectAccessed:Get", marker), IgnoredNotCreated, "creates no object"},
		"ceph lifecycle":         {record("ceph:s3", "ObjectLifecycle:Expiration:Current", marker), IgnoredNotCreated, "creates no object"},
		"amazon restore":         {record("aws:s3", "ObjectRestore:Completed", marker), IgnoredNotCreated, "creates no object"},
		"unknown event":          {record("minio:s3", "s3:ObjectMaterialized:Put", marker), IgnoredUnknownEvent, `"s3:ObjectMaterialized:Put" is not one`},
		"creation without kind":  {record("aws:s3", "ObjectCreated", marker), IgnoredUnknownEvent, "is not one"},
		"no event name":          {record("aws:s3", "", marker), IgnoredUnknownEvent, "is not one"},
		"unknown source":         {record("aws:sqs", "ObjectCreated:Put", marker), IgnoredUnknownSource, `eventSource "aws:sqs" is not an S3 store's`},
		"source without store":   {record(":s3", "ObjectCreated:Put", marker), IgnoredUnknownSource, "is not an S3 store's"},
		"eventbridge deletion":   {`{"source":"aws.s3","detail-type":"Object Deleted","detail":{"bucket":{"name":"fleet-uploads"},"object":{"key":"` + marker + `"}}}`, IgnoredNotCreated, `"Object Deleted" creates no object`},
		"minio envelope removal": {`{"EventName":"s3:ObjectRemoved:Delete","Key":"x","Records":` + recordsOf(t, record("minio:s3", "s3:ObjectRemoved:Delete", marker)) + `}`, IgnoredNotCreated, "creates no object"},
	} {
		p := plan(t, c.body)
		require.Equal(t, "ignored", p.Outcome, name)
		require.Equal(t, c.reason, p.IgnoredReason, name)
		require.Contains(t, p.Reason, c.says, name)
		require.Contains(t, IgnoredReasons, p.IgnoredReason, name)
	}
}

// record is an S3 event notification of one record.
func record(source, eventName, key string) string {
	b, _ := json.Marshal(map[string]any{"Records": []any{map[string]any{
		"eventVersion": "2.1", "eventSource": source, "awsRegion": "", "eventName": eventName,
		"s3": map[string]any{"bucket": map[string]any{"name": "fleet-uploads"}, "object": map[string]any{"key": key}},
	}}})
	return string(b)
}

// recordsOf returns the Records array of a notification.
func recordsOf(t *testing.T, body string) string {
	t.Helper()
	var n struct{ Records json.RawMessage }
	require.NoError(t, json.Unmarshal([]byte(body), &n))
	return string(n.Records)
}

// snsWrapped is body as the Message of an SNS notification.
func snsWrapped(t *testing.T, body string) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"Type": "Notification", "MessageId": "m1", "Message": body})
	require.NoError(t, err)
	return string(b)
}

// TestClassifyRecord: the event sources and names of S3-compatible stores.
func TestClassifyRecord(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		source, name string
		created      bool
		ignore       string
	}{
		{"aws:s3", "ObjectCreated:Put", true, ""},
		{"minio:s3", "s3:ObjectCreated:Put", true, ""},
		{"minio:s3", "s3:ObjectCreated:CompleteMultipartUpload", true, ""},
		{"ceph:s3", "ObjectCreated:Copy", true, ""},
		{"", "ObjectCreated:Put", true, ""},
		{"minio:s3", "s3:ObjectCreated:PutRetention", false, IgnoredNotCreated},
		{"minio:s3", "s3:ObjectCreated:DeleteTagging", false, IgnoredNotCreated},
		{"minio:s3", "s3:Scanner:ManyVersions", false, IgnoredNotCreated},
		{"minio:s3", "s3:BucketCreated", false, IgnoredNotCreated},
		{"aws:s3", "LifecycleExpiration:Delete", false, IgnoredNotCreated},
		{"aws:s3", "s3:s3:ObjectCreated:Put", false, IgnoredUnknownEvent},
		{"aws:s3", "objectcreated:put", false, IgnoredUnknownEvent},
		{"aws:s3", "TestEvent", false, IgnoredUnknownEvent},
		{"minio", "s3:ObjectCreated:Put", false, IgnoredUnknownSource},
		{"minio:s3 ", "s3:ObjectCreated:Put", false, IgnoredUnknownSource},
		{"aws:lambda", "ObjectCreated:Put", false, IgnoredUnknownSource},
	} {
		created, ignore := ClassifyRecord(c.source, c.name)
		require.Equal(t, c.created, created, "%q %q", c.source, c.name)
		require.Equal(t, c.ignore, ignore, "%q %q", c.source, c.name)
	}
}
