package sqsconsumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/s3events"
)

// Defaults of Config.
const (
	WaitTimeDefault      = 20 * time.Second
	MaxMessagesDefault   = 10
	ImportTimeoutDefault = 30 * time.Second
	BackoffMinDefault    = time.Second
	BackoffMaxDefault    = 30 * time.Second
	MarkerDefault        = "_SUCCESS"
	ReceiversDefault     = 8
	MaxBurstDefault      = 100
	LingerDefault        = 10 * time.Millisecond
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
	// DeletedLateObject: the message imports nothing and names data
	// objects of folders already published (s3events.OutcomeLateObject).
	DeletedLateObject = "late_object"
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
	// MaxBadRecords is the tolerance of bad records of the imports the
	// notifications make (jobs.ImportRequest.MaxBadRecords); 0: none.
	MaxBadRecords int
	// Mapping maps folders to tenants and holds the bucket allow-list: the
	// rule of enqueue serve.
	Mapping folder.Mapping
	// WaitTime is the long poll's WaitTimeSeconds, 0 to 20 s. Defaults to
	// WaitTimeDefault; a negative value means 0 (short polls).
	WaitTime time.Duration
	// MaxMessages per receive, 1 to 10. Defaults to MaxMessagesDefault.
	MaxMessages int
	// Receivers is how many long polls Run keeps in flight at once, 1 to
	// 64. A receive returns at most ten messages after a round trip of
	// tens of milliseconds, so a burst of MaxBurst folders needs about
	// MaxBurst/10 receives at once. Defaults to ReceiversDefault.
	Receivers int
	// MaxBurst is how many folders Run gathers from several receives
	// into one transaction: it stops adding receives once the burst holds
	// this many. Defaults to MaxBurstDefault.
	MaxBurst int
	// Linger is how long Run waits for more receives to join a burst
	// after the first arrived (while the previous burst commits, those
	// that arrive meanwhile join without waiting). Defaults to
	// LingerDefault; a negative value means no wait.
	Linger time.Duration
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
	// Batches, if set, looks up the folders of data-object events, once
	// per round: a message naming data objects of a folder whose newest
	// batch Succeeded is counted (ingest_late_object_events_total, once
	// per folder and message), logged, and deleted as late_object rather
	// than ignored. *batch.Store is one. Nil: such events are ignored.
	Batches s3events.LatestFinder
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
	case c.Receivers < 0 || c.Receivers > 64:
		return &ConfigError{"Receivers", "must be 1 to 64"}
	case c.MaxBurst < 0 || c.MaxBurst > 1000:
		return &ConfigError{"MaxBurst", "must be 1 to 1000"}
	case c.Linger > time.Second:
		return &ConfigError{"Linger", "must be at most 1s"}
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

// settlingRounds is how many committed rounds delete their messages at
// once (commitLoop).
const settlingRounds = 4

// MaxRequestsInFlight is the most SQS requests a Consumer with cfg (its
// defaults filled in) has in flight at once: a long poll per receiver,
// and the DeleteMessageBatch calls (ten messages each) of the rounds that
// settle together. An HTTP client should keep as many connections.
func MaxRequestsInFlight(cfg Config) int {
	receivers := cmp.Or(cfg.Receivers, ReceiversDefault)
	burst := cmp.Or(cfg.MaxBurst, MaxBurstDefault)
	return receivers + settlingRounds*((burst+9)/10)
}

// NewSQSClient returns an SQS client for a Consumer with cfg: it keeps an
// idle connection for every request the Consumer can have in flight at once
// (MaxRequestsInFlight). The SDK's default keeps 10 per host, so beyond
// that a request closed its connection and a later one dialled (and, to
// SQS, shook hands over TLS) again, in TestSQSConsumerKeepsItsConnections
// 78 to 210 connections for 3,000 messages instead of about 20.
func NewSQSClient(awsCfg aws.Config, cfg Config, optFns ...func(*sqs.Options)) *sqs.Client {
	conns := MaxRequestsInFlight(cfg)
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConnsPerHost = conns
		t.MaxIdleConns = max(t.MaxIdleConns, conns)
	})
	return sqs.NewFromConfig(awsCfg, append([]func(*sqs.Options){func(o *sqs.Options) { o.HTTPClient = httpClient }}, optFns...)...)
}

// Consumer receives S3 notifications from an SQS queue and imports the
// folders they complete.
type Consumer struct {
	cfg Config
	log *slog.Logger
	m   *metrics.Metrics
	now func() time.Time

	// pauseUntil holds Run's receivers back after a failed burst.
	pauseMu    sync.Mutex
	pauseUntil time.Time
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
	cfg.Receivers = cmp.Or(cfg.Receivers, ReceiversDefault)
	cfg.MaxBurst = cmp.Or(cfg.MaxBurst, MaxBurstDefault)
	if cfg.Linger == 0 {
		cfg.Linger = LingerDefault
	}
	cfg.Linger = max(cfg.Linger, 0)
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

// Run receives and imports until ctx ends, then finishes what it holds
// (commit and delete) and returns nil.
//
// Receivers goroutines long-poll at once; what their receives return is
// gathered into rounds: a round takes the receives that are waiting, and
// those that arrive within Linger of its first, until it holds MaxBurst
// folders, and imports their folders in one transaction. While one round
// commits the next gathers, and a committed round's messages are deleted
// (DeleteMessageBatch, ten to a call, the calls at once) while the next
// commits. A failed receive pauses its receiver, and a failed burst all
// of them, for a pause that doubles up to BackoffMax.
func (c *Consumer) Run(ctx context.Context) error {
	// While a round commits, the receivers go on receiving until the next
	// round's worth (MaxBurst messages) is in hand.
	received := make(chan delivery, max(1, c.cfg.MaxBurst/c.cfg.MaxMessages))
	var receivers sync.WaitGroup
	for range c.cfg.Receivers {
		receivers.Go(func() { c.receiveLoop(ctx, received) })
	}
	go func() {
		receivers.Wait()
		close(received)
	}()
	c.commitLoop(ctx, received)
	return nil
}

// receiveLoop long-polls until ctx ends and hands what each receive
// returned to the commit loop. Messages in hand are always handed over,
// even when ctx ended meanwhile.
func (c *Consumer) receiveLoop(ctx context.Context, out chan<- delivery) {
	failures := 0
	for sleep(ctx, c.paused()) {
		msgs, err := c.receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.m.SQSReceiveErrors.Inc()
			failures++
			pause := c.backoff(failures)
			c.log.Warn("sqs round failed: backing off", "stage", "receive", "error", err.Error(), "failures", failures, "backoff_seconds", pause.Seconds())
			if !sleep(ctx, pause) {
				return
			}
			continue
		}
		failures = 0
		if len(msgs) == 0 {
			// A short poll found nothing: do not spin.
			if c.cfg.WaitTime < 0 && !sleep(ctx, c.cfg.BackoffMin) {
				return
			}
			continue
		}
		out <- c.read(msgs)
	}
}

// commitLoop gathers deliveries into rounds and imports each, until
// received is closed; then it waits for the deletes in flight.
func (c *Consumer) commitLoop(ctx context.Context, received <-chan delivery) {
	settleCtx := context.WithoutCancel(ctx)
	var settling sync.WaitGroup
	slots := make(chan struct{}, settlingRounds) // rounds whose deletes run at once
	failures := 0
	for open := true; open; {
		var r *round
		r, open = c.gather(received)
		if r == nil {
			continue
		}
		err := c.importBurst(settleCtx, r)
		slots <- struct{}{}
		settling.Go(func() {
			defer func() { <-slots }()
			c.settle(settleCtx, r, err)
		})
		if err == nil {
			failures = 0
			continue
		}
		failures++
		pause := c.backoff(failures)
		c.log.Warn("sqs round failed: backing off", "stage", "import", "error", err.Error(), "failures", failures, "backoff_seconds", pause.Seconds())
		c.pause(pause)
		sleep(ctx, pause)
	}
	settling.Wait()
}

// gather waits for a delivery and starts a round with it, then adds the
// deliveries waiting or arriving within Linger until the round holds
// MaxBurst folders (or messages). open is false once received is closed;
// the round is nil if nothing came.
func (c *Consumer) gather(received <-chan delivery) (r *round, open bool) {
	d, ok := <-received
	if !ok {
		return nil, false
	}
	r = &round{seen: map[string]*message{}}
	r.add(d)
	linger := time.NewTimer(c.cfg.Linger)
	defer linger.Stop()
	for len(r.burst) < c.cfg.MaxBurst && len(r.msgs) < c.cfg.MaxBurst {
		select {
		case d, ok := <-received:
			if !ok {
				return r, false
			}
			r.add(d)
		case <-linger.C:
			return r, true
		}
	}
	return r, true
}

// paused returns how long the receivers are still held back after a
// failed burst.
func (c *Consumer) paused() time.Duration {
	c.pauseMu.Lock()
	defer c.pauseMu.Unlock()
	return time.Until(c.pauseUntil)
}

func (c *Consumer) pause(d time.Duration) {
	c.pauseMu.Lock()
	defer c.pauseMu.Unlock()
	c.pauseUntil = time.Now().Add(d)
}

// sleep waits d or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return ctx.Err() == nil
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
	// burst holds the indices of its imports in its delivery's, then its
	// round's, burst.
	burst []int
	// data are its events for data objects of mapped folders
	// (s3events.Planned.DataFolder), looked up with the round's.
	data []s3events.Planned
}

func (m *message) leave(reason, detail string) {
	// A reason that can never succeed wins over one that might.
	if m.reason == "" || (permanent(reason) && !permanent(m.reason)) {
		m.reason, m.detail = reason, detail
	}
}

// delivery is what one receive returned, read: its messages and the
// imports they complete.
type delivery struct {
	msgs  []*message
	burst []jobs.ImportRequest
}

// read plans the imports of a receive's messages (in the receiver's
// goroutine, while the commit loop waits on the database).
func (c *Consumer) read(msgs []*message) delivery {
	d := delivery{msgs: msgs}
	for _, m := range msgs {
		c.plan(m, &d.burst)
	}
	return d
}

// round is the messages of one or more receives whose folders are
// imported in one transaction, one entry per message id (a message handed
// out twice keeps the later receipt handle, the one that deletes it).
type round struct {
	msgs  []*message
	burst []jobs.ImportRequest
	seen  map[string]*message
}

func (r *round) add(d delivery) {
	for _, m := range d.msgs {
		if prev, ok := r.seen[m.id]; ok {
			prev.receipt = m.receipt
			continue
		}
		r.seen[m.id] = m
		own := m.burst
		m.burst = make([]int, 0, len(own))
		for _, k := range own {
			m.burst = append(m.burst, len(r.burst))
			r.burst = append(r.burst, d.burst[k])
		}
		r.msgs = append(r.msgs, m)
	}
}

// Round receives once (a long poll of up to MaxMessages) and handles what
// arrived: one burst transaction for every folder the messages complete,
// then the delete of the messages that are done. If ctx ends during the
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
	r := &round{seen: map[string]*message{}}
	r.add(c.read(msgs))
	err = c.importBurst(ctx, r)
	return c.settle(ctx, r, err), err
}

// settle deletes the round's messages that are done (after the test pause,
// if the burst committed), counts every message and logs those left.
func (c *Consumer) settle(ctx context.Context, r *round, importErr error) RoundResult {
	if importErr == nil && len(r.burst) > 0 && c.cfg.DelayAfterCommit > 0 {
		c.log.Warn("test delay between commit and delete", "delay_seconds", c.cfg.DelayAfterCommit.Seconds(), "folders", len(r.burst))
		time.Sleep(c.cfg.DelayAfterCommit)
	}
	c.delete(ctx, r.msgs)
	res := RoundResult{Received: len(r.msgs), Folders: len(r.burst)}
	for _, m := range r.msgs {
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
	return res
}

// receive long-polls the queue and returns its messages.
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
	msgs := make([]*message, 0, len(out.Messages))
	oldest := time.Duration(0)
	for _, raw := range out.Messages {
		c.m.SQSMessagesReceived.Inc()
		if n, err := strconv.Atoi(raw.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil {
			c.m.SQSReceiveCount.Observe(float64(n))
		}
		if ms, err := strconv.ParseInt(raw.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
			oldest = max(oldest, c.now().Sub(time.UnixMilli(ms)))
		}
		msgs = append(msgs, &message{Message: raw, id: aws.ToString(raw.MessageId), receipt: aws.ToString(raw.ReceiptHandle)})
	}
	c.m.SQSOldestMessageAge.Set(oldest.Seconds())
	return msgs, nil
}

// plan reads a message and adds the imports it completes to the burst, or
// marks it left.
func (c *Consumer) plan(m *message, burst *[]jobs.ImportRequest) {
	qm, err := s3events.ReadQueueMessage([]byte(aws.ToString(m.Body)))
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
	var ignored []s3events.Planned
	defer func() { c.countIgnored(ignored...) }()
	for _, p := range s3events.PlanEvents(qm.Events, c.cfg.Marker, c.cfg.Mapping) {
		switch p.Outcome {
		case "":
			m.burst = append(m.burst, len(*burst))
			p.Request.MaxBadRecords = c.cfg.MaxBadRecords
			*burst = append(*burst, p.Request)
			m.outcome = DeletedImported
		case "ignored":
			if p.DataFolder != nil {
				m.data = append(m.data, p) // counted once looked up: it may be late_object
			} else {
				ignored = append(ignored, p)
			}
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

// importBurst imports the round's folders in one transaction (if it has
// any) and marks each message by its folders' outcomes.
func (c *Consumer) importBurst(ctx context.Context, r *round) error {
	c.findLateObjects(ctx, r)
	if len(r.burst) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ImportTimeout)
	defer cancel()
	results, err := c.cfg.Importer.ImportMany(ctx, r.burst)
	if err == nil && len(results) != len(r.burst) {
		err = fmt.Errorf("%d outcomes for %d imports", len(results), len(r.burst))
	}
	for _, m := range r.msgs {
		for _, k := range m.burst {
			if err != nil {
				m.leave(LeftDatabaseUnavailable, err.Error())
				continue
			}
			switch res := results[k]; res.Outcome {
			case jobs.OutcomeEnqueued, jobs.OutcomeConflict, jobs.OutcomeAlreadySucceeded, jobs.OutcomeResumable:
			case jobs.OutcomeInvalidInput:
				m.leave(LeftInvalidInput, fmt.Sprintf("%s: %s: %s", r.burst[k].Folder, res.Field, res.Error))
			default:
				m.leave(LeftEnqueueFailed, fmt.Sprintf("%s: %s %s", r.burst[k].Folder, res.Outcome, res.Error))
			}
		}
	}
	if err != nil {
		return fmt.Errorf("importing %d folders: %w", len(r.burst), err)
	}
	return nil
}

// findLateObjects looks up, once for the round, the folders its messages'
// data-object events name, and counts and logs, once per folder and
// message, those already published; a message that imports nothing is
// then deleted as late_object. A failed look-up leaves the messages as
// they were (ignored): nothing depends on it, and reconcile finds the
// changed folders all the same.
func (c *Consumer) findLateObjects(ctx context.Context, r *round) {
	var all []s3events.Planned
	for _, m := range r.msgs {
		all = append(all, m.data...)
	}
	// Those not found late stay ignored (data_object).
	defer func() { c.countIgnored(all...) }()
	if c.cfg.Batches == nil || len(all) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ImportTimeout)
	defer cancel()
	if _, err := s3events.FindLateObjects(ctx, c.cfg.Batches, all); err != nil {
		c.log.Warn("could not look up the folders of data-object events; the messages count as ignored", "error", err.Error())
		return
	}
	rest := all
	for _, m := range r.msgs {
		own := rest[:len(m.data)]
		rest = rest[len(m.data):]
		late := s3events.LateFoldersOf(own)
		if len(late) == 0 {
			continue
		}
		c.m.LateObjectEvents.WithLabelValues(metrics.DoorSQS).Add(float64(len(late)))
		s3events.LogLateFolders(c.log.With("message_id", m.id), metrics.DoorSQS, late)
		if m.outcome == DeletedIgnored {
			m.outcome = DeletedLateObject
		}
	}
}

// countIgnored counts the ignored events among plans (one message's, or
// the data-object events of a round) by reason
// (ingest_events_ignored_total), and logs the first of an unknown shape
// (an event name or eventSource no store is known to send) with what the
// store sent.
func (c *Consumer) countIgnored(plans ...s3events.Planned) {
	logged := false
	for _, p := range plans {
		if p.Outcome != "ignored" {
			continue
		}
		c.m.EventsIgnored.WithLabelValues(metrics.DoorSQS, p.IgnoredReason).Inc()
		if !logged && (p.IgnoredReason == s3events.IgnoredUnknownEvent || p.IgnoredReason == s3events.IgnoredUnknownSource) {
			logged = true
			c.log.Warn("object event of an unknown shape ignored", "door", metrics.DoorSQS, "bucket", p.Bucket, "key", p.Key,
				"ignored_reason", p.IgnoredReason, "reason", p.Reason)
		}
	}
}

// delete deletes the messages that are done, ten to a call, the calls at
// once; a message whose delete fails is marked left (delete_failed).
func (c *Consumer) delete(ctx context.Context, msgs []*message) {
	var done []*message
	for _, m := range msgs {
		if m.reason == "" {
			done = append(done, m)
		}
	}
	var calls sync.WaitGroup
	for start := 0; start < len(done); start += 10 {
		chunk := done[start:min(start+10, len(done))]
		calls.Go(func() { c.deleteBatch(ctx, chunk) })
	}
	calls.Wait()
}

// deleteBatch deletes up to ten messages in one DeleteMessageBatch call.
func (c *Consumer) deleteBatch(ctx context.Context, chunk []*message) {
	entries := make([]types.DeleteMessageBatchRequestEntry, len(chunk))
	for i, m := range chunk {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(m.receipt)}
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ImportTimeout)
	defer cancel()
	out, err := c.cfg.Queue.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(c.cfg.QueueURL), Entries: entries})
	if err != nil {
		for _, m := range chunk {
			m.leave(LeftDeleteFailed, err.Error())
		}
		return
	}
	for _, f := range out.Failed {
		i, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || i < 0 || i >= len(chunk) {
			continue
		}
		chunk[i].leave(LeftDeleteFailed, aws.ToString(f.Code)+": "+aws.ToString(f.Message))
	}
}
