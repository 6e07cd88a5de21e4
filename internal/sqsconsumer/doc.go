// Package sqsconsumer imports the folders that S3 notifications complete,
// read from an Amazon SQS queue (enqueue sqs).
//
// One receive is one round:
//
//	ReceiveMessage (long poll, up to 10 messages)
//	  │ each body read once: uploads.ReadQueueMessage (S3 event, SNS
//	  │ envelope raw or not, EventBridge), then uploads.PlanEvents with
//	  │ the marker and folder.Mapping — the code of enqueue serve
//	  ▼
//	Enqueuer.ImportMany(every folder the round completes)   ── one transaction
//	  │ committed
//	  ▼
//	DeleteMessageBatch(the messages all of whose folders now have a batch,
//	                   the test events, the messages completing no folder)
//
// A message is deleted only after the transaction holding its folders'
// reservations committed. A crash between the commit and the delete leaves
// the messages in the queue: they come back after the visibility timeout,
// their folders answer conflict (the batch is Running) or
// already_succeeded, and they are deleted then. The reservation, not the
// queue, makes the import idempotent, so replicas can share a queue and
// SQS's at-least-once delivery duplicates no batch.
//
// A message is left in the queue, counted by reason and logged with its
// message id, when:
//   - it can never succeed: malformed, a folder of no tenant (unmapped), a
//     bucket not on the allow-list (bucket_not_allowed), a tenant, database
//     or company that is not valid (invalid_input), an SNS control message
//     (sns_control). The queue's redrive policy moves it to the dead-letter
//     queue after maxReceiveCount receives; nothing is dropped silently.
//     Folders of the same message that can be imported are imported.
//   - the database failed (database_unavailable): nothing of the round
//     committed; the visibility is not extended, the messages come back
//     after the visibility timeout and the consumer backs off.
//   - the job insert failed (enqueue_failed, the batch is recorded Failed
//     and the scope free) or the delete failed (delete_failed): it comes
//     back and is tried again.
//
// Shutdown: when the context ends, the round in hand is finished — its
// burst committed and its messages deleted — under a context of its own,
// then Run returns.
package sqsconsumer
