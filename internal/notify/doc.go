// Package notify tells tenants how their batches ended: every terminal
// outcome of a batch (succeeded, failed, parked) becomes one Notification,
// sent by a Sender to each of the tenant's destinations. The River job that
// sends them (internal/jobs) is inserted in the same transaction as the
// batch's terminal write and retried; this package holds the parts that do
// not depend on River: the destinations file, the message, its signature,
// and one delivery attempt.
//
// # Destinations
//
// A worker reads the tenants' destinations from a JSON file
// (worker run --notifications-file), in production a Kubernetes Secret
// mounted as a file, because it carries the webhooks' signing secrets:
//
//	{"tenants": {"acme": [
//	  {"name": "ops-hook", "kind": "webhook", "url": "https://hooks.acme.example/fleet", "secret": "at least 16 bytes"},
//	  {"name": "alerts", "kind": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:fleet-acme"}
//	]}}
//
// Parse reads it strictly: no unknown field, no tenant twice, tenant ids
// as batch.ValidateTenantID accepts them, destination names of [a-z0-9_-]
// (at most 64 bytes) unique per tenant, a webhook's url https (http only
// for a loopback host: 127.0.0.0/8, ::1 or localhost, for development and
// tests) and its secret at least 16 bytes, an SNS destination's topic_arn
// arn:<partition>:sns:<region>:<12-digit account>:<topic name>. An error
// names the tenant, the destination's index and name and the field, never
// a secret or a URL's userinfo, query or fragment. A Registry holds the file
// and reloads it when it changes, keeping the destinations last read (and
// counting ingest_notifications_config_reload_failures_total) when it no
// longer parses. A Destination prints (String, LogValue) without its secret.
//
// # Webhooks
//
// A webhook receives a POST of the Notification as JSON with the headers
//
//	Content-Type: application/json
//	X-Fleet-Event: batch.<outcome>
//	X-Fleet-Idempotency-Key: <the notification's idempotency key>
//	X-Fleet-Timestamp: <unix seconds>
//	X-Fleet-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>
//
// the scheme of the door's signed imports (uploads.Sign). A receiver checks
// the signature with Verify (or its own HMAC over the raw body), refuses old
// timestamps, and deduplicates by the idempotency key. Any 2xx answer is a
// delivery; any other answer, a redirect included (redirects are never
// followed), or a transport error is a failed attempt.
//
// # Amazon SNS
//
// An SNS destination publishes the same JSON as the message, with a short
// subject ("fleet batch 42 failed") and the String message attributes
// idempotency_key, outcome and tenant_id. A FIFO topic (its name ends in
// .fifo) also gets a message group (the tenant and the batch) and a
// deduplication id (the SHA-256 of the idempotency key), so SNS drops a
// retried attempt's duplicate within its five-minute window.
//
// # Idempotency
//
// A notification's IdempotencyKey (Key) is the same on every attempt to
// send it: "batch-<batch id>-<outcome>-<generation>", the generation being
// the execution lease's generation of the term that wrote the outcome. The
// batch id and outcome alone do not suffice: a batch whose publication
// failed can be resumed and fail again, and each of those outcomes is news.
// Receivers must expect a notification more than once (a retried attempt
// whose first delivery succeeded unseen) and drop the repeats by key.
package notify
