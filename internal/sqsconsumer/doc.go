// Package sqsconsumer imports the folders that S3 notifications complete,
// read from an Amazon SQS queue (enqueue sqs).
//
// Run keeps Config.Receivers long polls in flight at once (as SQS
// consumers do to fill a process: one receive returns at most ten
// messages) and gathers what they return into rounds:
//
//	ReceiveMessage × Receivers (long polls, up to 10 messages each)
//	  │ each body read once, in its receiver: s3events.ReadQueueMessage
//	  │ (S3 event, SNS envelope raw or not, EventBridge), then
//	  │ s3events.PlanEvents with the marker and folder.Mapping — the code
//	  │ enqueue serve and reconcile run too
//	  ▼
//	round: the receives waiting, and those arriving within Linger of the
//	  │    first, up to MaxBurst folders (one entry per message id)
//	  ▼
//	Enqueuer.ImportMany(every folder the round completes)   ── one transaction
//	  │ committed                          (the next round gathers meanwhile)
//	  ▼
//	DeleteMessageBatch × ⌈messages/10⌉, at once (the messages all of whose
//	    folders now have a batch, the test events, the messages completing
//	    no folder), while the next round commits
//
// Round does the same for a single receive, synchronously (tests, and
// the unit of the design).
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
//     after the visibility timeout and the consumer backs off (no
//     receiver starts a receive until the pause ends).
//   - the job insert failed (enqueue_failed, the batch is recorded Failed
//     and the scope free) or the delete failed (delete_failed): it comes
//     back and is tried again.
//
// Shutdown: when the context ends, the long polls in flight are
// abandoned (a message a cancelled poll took comes back after the
// visibility timeout), and every message in hand is finished — its round
// committed and its messages deleted — under a context of its own, then
// Run returns.
package sqsconsumer
