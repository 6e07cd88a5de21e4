package sqsconsumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/uploads"
)

// Defaults of Config.
const (
	WaitTimeDefault      = 20 * time.Second
	MaxMessagesDefault   = 10
	ImportTimeoutDefault = 30 * time.Second
	BackoffMinDefault    = time.Second
	BackoffMaxDefault    = 30 * time.Second
	MarkerDefault        = "_SUCCESS"
)

// Reasons a message is left in the queue (the reason label of
// ingest_sqs_messages_left_total).
const (
	LeftMalformed           = "malformed"
	LeftUnmapped            = "unmapped"
	LeftBucketNotAllowed    = "bucket_not_allowed"
	LeftInvalidInput        = "invalid_input"
	LeftSNSControl          = "sns_control"
	LeftDatabaseUnavailable = "database_unavailable"
	LeftEnqueueFailed       = "enqueue_failed"
	LeftDeleteFailed        = "delete_failed"
)

// Outcomes of a deleted message (the outcome label of
// ingest_sqs_messages_deleted_total).
const (
	DeletedImported  = "imported"
	DeletedIgnored   = "ignored"
	DeletedTestEvent = "test_event"
)

// permanent reports whether a message left for reason can never succeed
// (it ends in the dead-letter queue).
func permanent(reason string) bool {
	switch reason {
	case LeftMalformed, LeftUnmapped, LeftBucketNotAllowed, LeftInvalidInput, LeftSNSControl:
		return true
	}
	return false
}

// Queue is the part of the SQS API the consumer uses; *sqs.Client is one.
type Queue interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, optFns ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
}

// Importer reserves and enqueues a burst of folders in one transaction;
// *jobs.Enqueuer is one. An error means nothing of the burst committed.
type Importer interface {
	ImportMany(ctx context.Context, reqs []jobs.ImportRequest) ([]jobs.Result, error)
}

// Config configures a Consumer.
type Config struct {
	Queue    Queue
	QueueURL string
	Importer Importer
	// Marker is the object name whose creation completes a folder.
	// Defaults to MarkerDefault.
	Marker string
	// Mapping maps folders to tenants and holds the bucket allow-list: the
	// rule of enqueue serve.
	Mapping folder.Mapping
	// WaitTime is the long poll's WaitTimeSeconds, 0 to 20 s. Defaults to
	// WaitTimeDefault; a negative value means 0 (short polls).
	WaitTime time.Duration
	// MaxMessages per receive, 1 to 10. Defaults to MaxMessagesDefault.
	MaxMessages int
	// VisibilityTimeout, if positive, overrides the queue's for the
	// messages received: it must exceed the time a round takes.
	VisibilityTimeout time.Duration
	// ImportTimeout bounds the burst transaction. Defaults to
	// ImportTimeoutDefault.
	ImportTimeout time.Duration
	// BackoffMin and BackoffMax bound the pause after a failed round
	// (doubling from min to max), and BackoffMin the pause after a short
	// poll that found nothing. Default to BackoffMinDefault and
	// BackoffMaxDefault.
	BackoffMin, BackoffMax time.Duration
	// DelayAfterCommit pauses between the burst's commit and the delete.
	// For tests only: it widens the window a crash can fall into.
	DelayAfterCommit time.Duration
	// Metrics defaults to a fresh set.
	Metrics *metrics.Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// ConfigError is a setting Validate refuses: Setting names the Config field.
type ConfigError struct{ Setting, Reason string }

func (e *ConfigError) Error() string { return e.Setting + ": " + e.Reason }

// Validate checks the settings without contacting anything.
func (c *Config) Validate() error {
	switch {
	case c.QueueURL == "":
		return &ConfigError{"QueueURL", "is required"}
	case c.WaitTime > 20*time.Second:
		return &ConfigError{"WaitTime", "must be at most 20s (SQS's longest long poll)"}
	case c.MaxMessages < 0 || c.MaxMessages > 10:
		return &ConfigError{"MaxMessages", "must be 1 to 10"}
	case c.VisibilityTimeout < 0 || c.VisibilityTimeout > 12*time.Hour:
		return &ConfigError{"VisibilityTimeout", "must be 0 (the queue's) to 12h"}
	case c.VisibilityTimeout > 0 && c.VisibilityTimeout < time.Second:
		return &ConfigError{"VisibilityTimeout", "must be whole seconds, at least 1s"}
	case c.ImportTimeout < 0:
		return &ConfigError{"ImportTimeout", "must not be negative"}
	case c.BackoffMin < 0 || c.BackoffMax < 0 || (c.BackoffMax > 0 && c.BackoffMin > c.BackoffMax):
		return &ConfigError{"Backoff", "must be positive, min at most max"}
	}
	if err := c.Mapping.Validate(); err != nil {
		return &ConfigError{"Mapping", err.Error()}
	}
	return nil
}

// Consumer receives S3 notifications from an SQS queue and imports the
// folders they complete.
type Consumer struct {
	cfg Config
	log *slog.Logger
	m   *metrics.Metrics
	now func() time.Time
}

// New validates cfg and fills its defaults.
func New(cfg Config) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Queue == nil || cfg.Importer == nil {
		return nil, errors.New("sqsconsumer: Queue and Importer are required")
	}
	cfg.Marker = cmp.Or(cfg.Marker, MarkerDefault)
	if cfg.WaitTime == 0 {
		cfg.WaitTime = WaitTimeDefault
	}
	cfg.MaxMessages = cmp.Or(cfg.MaxMessages, MaxMessagesDefault)
	cfg.ImportTimeout = cmp.Or(cfg.ImportTimeout, ImportTimeoutDefault)
	cfg.BackoffMin = cmp.Or(cfg.BackoffMin, BackoffMinDefault)
	cfg.BackoffMax = max(cmp.Or(cfg.BackoffMax, BackoffMaxDefault), cfg.BackoffMin)
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Consumer{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, now: time.Now}, nil
}

// Run receives and imports until ctx ends, then finishes the round in hand
// (commit and delete) and returns nil. A failed round (SQS or the database
// unavailable) is followed by a pause that doubles up to BackoffMax.
func (c *Consumer) Run(ctx context.Context) error {
	failures := 0
	for ctx.Err() == nil {
		res, err := c.Round(ctx)
		if err != nil {
			failures++
			pause := c.backoff(failures)
			c.log.Warn("sqs round failed: backing off", "error", err.Error(), "failures", failures, "backoff", pause)
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
			continue
		}
		failures = 0
		if res.Received == 0 && c.cfg.WaitTime < 0 {
			// A short poll found nothing: do not spin.
			select {
			case <-ctx.Done():
			case <-time.After(c.cfg.BackoffMin):
			}
		}
	}
	return nil
}

func (c *Consumer) backoff(failures int) time.Duration {
	d := c.cfg.BackoffMin
	for i := 1; i < failures && d < c.cfg.BackoffMax; i++ {
		d *= 2
	}
	return min(d, c.cfg.BackoffMax)
}

// RoundResult counts what one round did with its messages.
type RoundResult struct {
	Received, Deleted, Left int
	// Folders is how many imports the round's burst held.
	Folders int
}

// message is one received message and what became of it.
type message struct {
	types.Message
	id      string
	receipt string
	// reason is why the message is left ("" while it may be deleted);
	// detail says more, for the log.
	reason, detail string
	// outcome is how a deleted message is counted.
	outcome string
	// burst holds the indices of its imports in the round's burst.
	burst []int
}

func (m *message) leave(reason, detail string) {
	// A reason that can never succeed wins over one that might.
	if m.reason == "" || (permanent(reason) && !permanent(m.reason)) {
		m.reason, m.detail = reason, detail
	}
}

// Round receives once (a long poll of up to MaxMessages) and handles what
// arrived: one burst transaction for every folder the messages complete,
// then one delete of the messages that are done. If ctx ends during the
// poll, nothing was received and Round returns; once messages are in hand
// they are handled under a context that ctx's end does not cancel. The
// error reports a failed receive or burst (the messages are left).
func (c *Consumer) Round(ctx context.Context) (RoundResult, error) {
	msgs, err := c.receive(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return RoundResult{}, nil
		}
		c.m.SQSReceiveErrors.Inc()
		return RoundResult{}, fmt.Errorf("receiving from SQS: %w", err)
	}
	if len(msgs) == 0 {
		return RoundResult{}, nil
	}
	ctx = context.WithoutCancel(ctx)
	res := RoundResult{Received: len(msgs)}

	var burst []jobs.ImportRequest
	for _, m := range msgs {
		c.plan(m, &burst)
	}
	res.Folders = len(burst)
	var roundErr error
	if len(burst) > 0 {
		roundErr = c.importBurst(ctx, msgs, burst)
		if roundErr == nil && c.cfg.DelayAfterCommit > 0 {
			c.log.Warn("test delay between commit and delete", "delay", c.cfg.DelayAfterCommit, "folders", len(burst))
			time.Sleep(c.cfg.DelayAfterCommit)
		}
	}
	c.delete(ctx, msgs)
	for _, m := range msgs {
		if m.reason == "" {
			res.Deleted++
			c.m.SQSMessagesDeleted.WithLabelValues(m.outcome).Inc()
			continue
		}
		res.Left++
		c.m.SQSMessagesLeft.WithLabelValues(m.reason).Inc()
		attrs := []any{"message_id", m.id, "reason", m.reason, "error", m.detail, "receive_count", m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]}
		if permanent(m.reason) {
			c.log.Error("sqs message left in the queue: it can never succeed and will reach the dead-letter queue", attrs...)
		} else {
			c.log.Warn("sqs message left in the queue: it comes back after the visibility timeout", attrs...)
		}
	}
	return res, roundErr
}

// receive long-polls the queue and returns its messages, one per message
// id (a server may hand a message out twice in one answer; the later
// receipt handle is the one that deletes it).
func (c *Consumer) receive(ctx context.Context) ([]*message, error) {
	in := &sqs.ReceiveMessageInput{
		QueueUrl:            aws.String(c.cfg.QueueURL),
		MaxNumberOfMessages: int32(c.cfg.MaxMessages),
		WaitTimeSeconds:     int32(max(c.cfg.WaitTime, 0) / time.Second),
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{
			types.MessageSystemAttributeNameApproximateReceiveCount, types.MessageSystemAttributeNameSentTimestamp,
		},
	}
	// The same attributes under their former name, for SQS-compatible
	// servers that know only that one (SQS accepts both).
	//lint:ignore SA1019 read by servers that predate MessageSystemAttributeNames
	in.AttributeNames = []types.QueueAttributeName{"ApproximateReceiveCount", "SentTimestamp"}
	if c.cfg.VisibilityTimeout > 0 {
		in.VisibilityTimeout = int32(c.cfg.VisibilityTimeout / time.Second)
	}
	start := c.now()
	out, err := c.cfg.Queue.ReceiveMessage(ctx, in)
	metrics.ObserveSince(c.m.SQSReceiveDuration, start)
	if err != nil {
		return nil, err
	}
	var msgs []*message
	seen := map[string]*message{}
	oldest := time.Duration(0)
	for _, raw := range out.Messages {
		c.m.SQSMessagesReceived.Inc()
		if n, err := strconv.Atoi(raw.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil {
			c.m.SQSReceiveCount.Observe(float64(n))
		}
		if ms, err := strconv.ParseInt(raw.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
			oldest = max(oldest, c.now().Sub(time.UnixMilli(ms)))
		}
		id := aws.ToString(raw.MessageId)
		if m, ok := seen[id]; ok {
			m.receipt = aws.ToString(raw.ReceiptHandle)
			continue
		}
		m := &message{Message: raw, id: id, receipt: aws.ToString(raw.ReceiptHandle)}
		seen[id] = m
		msgs = append(msgs, m)
	}
	c.m.SQSOldestMessageAge.Set(oldest.Seconds())
	return msgs, nil
}

// plan reads a message and adds the imports it completes to the burst, or
// marks it left.
func (c *Consumer) plan(m *message, burst *[]jobs.ImportRequest) {
	qm, err := uploads.ReadQueueMessage([]byte(aws.ToString(m.Body)))
	switch {
	case err != nil:
		m.leave(LeftMalformed, err.Error())
		return
	case qm.SNSType != "":
		m.leave(LeftSNSControl, fmt.Sprintf("an SNS %s: an operator confirms the subscription", qm.SNSType))
		return
	case qm.TestEvent:
		m.outcome = DeletedTestEvent
		return
	case len(qm.Events) == 0:
		m.leave(LeftMalformed, "no object events")
		return
	}
	m.outcome = DeletedIgnored
	for _, p := range uploads.PlanEvents(qm.Events, c.cfg.Marker, c.cfg.Mapping) {
		switch p.Outcome {
		case "":
			m.burst = append(m.burst, len(*burst))
			*burst = append(*burst, p.Request)
			m.outcome = DeletedImported
		case "ignored":
		case "unmapped":
			reason := LeftUnmapped
			if c.cfg.Mapping.BucketAccepted(p.Bucket) != nil {
				reason = LeftBucketNotAllowed
			}
			m.leave(reason, fmt.Sprintf("s3://%s/%s: %s", p.Bucket, p.Key, p.Reason))
		default:
			m.leave(LeftInvalidInput, fmt.Sprintf("s3://%s/%s: %s: %s", p.Bucket, p.Key, p.Field, p.Reason))
		}
	}
}

// importBurst imports the round's folders in one transaction and marks
// each message by its folders' outcomes.
func (c *Consumer) importBurst(ctx context.Context, msgs []*message, burst []jobs.ImportRequest) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ImportTimeout)
	defer cancel()
	results, err := c.cfg.Importer.ImportMany(ctx, burst)
	if err == nil && len(results) != len(burst) {
		err = fmt.Errorf("%d outcomes for %d imports", len(results), len(burst))
	}
	for _, m := range msgs {
		for _, k := range m.burst {
			if err != nil {
				m.leave(LeftDatabaseUnavailable, err.Error())
				continue
			}
			switch r := results[k]; r.Outcome {
			case jobs.OutcomeEnqueued, jobs.OutcomeConflict, jobs.OutcomeAlreadySucceeded:
			case jobs.OutcomeInvalidInput:
				m.leave(LeftInvalidInput, fmt.Sprintf("%s: %s: %s", burst[k].Folder, r.Field, r.Error))
			default:
				m.leave(LeftEnqueueFailed, fmt.Sprintf("%s: %s %s", burst[k].Folder, r.Outcome, r.Error))
			}
		}
	}
	if err != nil {
		return fmt.Errorf("importing %d folders: %w", len(burst), err)
	}
	return nil
}

// delete deletes the messages that are done, ten to a call; a message
// whose delete fails is marked left (delete_failed).
func (c *Consumer) delete(ctx context.Context, msgs []*message) {
	var done []*message
	for _, m := range msgs {
		if m.reason == "" {
			done = append(done, m)
		}
	}
	for start := 0; start < len(done); start += 10 {
		chunk := done[start:min(start+10, len(done))]
		entries := make([]types.DeleteMessageBatchRequestEntry, len(chunk))
		for i, m := range chunk {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(m.receipt)}
		}
		dctx, cancel := context.WithTimeout(ctx, c.cfg.ImportTimeout)
		out, err := c.cfg.Queue.DeleteMessageBatch(dctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(c.cfg.QueueURL), Entries: entries})
		cancel()
		if err != nil {
			for _, m := range chunk {
				m.leave(LeftDeleteFailed, err.Error())
			}
			continue
		}
		for _, f := range out.Failed {
			i, err := strconv.Atoi(aws.ToString(f.Id))
			if err != nil || i < 0 || i >= len(chunk) {
				continue
			}
			chunk[i].leave(LeftDeleteFailed, aws.ToString(f.Code)+": "+aws.ToString(f.Message))
		}
	}
}
