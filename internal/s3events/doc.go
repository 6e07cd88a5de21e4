// Package s3events reads and plans the notifications of objects written to
// S3, for every door that receives them: the HTTP door (enqueue serve,
// internal/uploads), the SQS consumer (enqueue sqs, internal/sqsconsumer)
// and reconcile (internal/reconcile), which makes the events of the
// markers it lists.
//
//   - ReadNotification classifies a body once — an S3 event notification,
//     an SNS envelope (read strictly: only SNS's own fields, only its
//     Message is imported) or an EventBridge event — and Notification.Events
//     reads its object events; ParseS3Event does both, ReadQueueMessage
//     does both for an SQS message (test events, SNS control messages).
//   - The records of S3-compatible stores are read as Amazon's
//     (ClassifyRecord): MinIO's and Ceph RGW's event names with or
//     without the "s3:" prefix, any eventSource "<store>:s3", any region,
//     and MinIO's webhook envelope ({"EventName", "Key", "Records"}).
//   - PlanEvents decides which events complete a folder (its marker was
//     created) and which tenant's import that folder is (folder.Mapping),
//     validating each import; every other event is ignored for one of
//     IgnoredReasons (data_object, not_created, unknown_event,
//     unknown_source), which the doors answer and count.
//   - FindLateObjects marks the events for data objects of folders already
//     published (OutcomeLateObject), in one look-up (LatestFinder);
//     LateFoldersOf and LogLateFolders count and log them once per folder.
//
// Nothing here authenticates: the HTTP door verifies SNS signatures
// (SNSMessage.StringToSign is the text it checks), and for SQS the queue's
// access policy is the authority.
package s3events
