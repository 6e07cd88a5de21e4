package notify

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/fleet/ingest/internal/metrics"
)

// DefaultTimeout bounds a webhook attempt when the Sender has no HTTP
// client of its own.
const DefaultTimeout = 10 * time.Second

// SNSPublisher is the part of *sns.Client a Sender uses.
type SNSPublisher interface {
	Publish(ctx context.Context, in *sns.PublishInput, optFns ...func(*sns.Options)) (*sns.PublishOutput, error)
}

// Sender makes one attempt to deliver a notification to a destination;
// retries are its caller's (the River job). A Sender is safe for
// concurrent use.
type Sender struct {
	// HTTP posts to webhooks; nil is a client with DefaultTimeout.
	// Whatever its CheckRedirect, a Sender never follows a redirect: a
	// 3xx answer is a failed attempt (a receiver that moved says so in
	// the destinations file, and a redirect cannot carry the signed POST
	// to another host).
	HTTP *http.Client
	// SNS publishes to SNS destinations (an *sns.Client); nil fails them.
	SNS SNSPublisher
	// Metrics, if not nil, counts the attempts
	// (ingest_notifications_sent_total and _failed_total, by kind).
	Metrics *metrics.Metrics
	// Now signs webhooks; nil is time.Now.
	Now func() time.Time
}

// SendError is a failed attempt: which destination (never its secret, and
// a webhook's URL only as scheme://host/path), the HTTP status of a
// webhook's answer, and the cause.
type SendError struct {
	Name   string
	Kind   Kind
	Target string
	// StatusCode is the webhook's answer (0: none).
	StatusCode int
	Err        error
}

func (e *SendError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "notify: %s %q (%s)", e.Kind, e.Name, e.Target)
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, ": HTTP %d", e.StatusCode)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

func (e *SendError) Unwrap() error { return e.Err }

// Send makes one attempt to deliver n to d: a signed POST to a webhook, a
// Publish to an SNS topic (see the package documentation). It returns nil
// once the destination took the notification, else a *SendError.
func (s *Sender) Send(ctx context.Context, d Destination, n Notification) error {
	err := s.send(ctx, d, n)
	if s.Metrics != nil && (d.Kind == KindWebhook || d.Kind == KindSNS) {
		if err == nil {
			s.Metrics.NotificationsSent.WithLabelValues(string(d.Kind)).Inc()
		} else {
			s.Metrics.NotificationsFailed.WithLabelValues(string(d.Kind)).Inc()
		}
	}
	return err
}

func (s *Sender) send(ctx context.Context, d Destination, n Notification) error {
	fail := func(status int, err error) error {
		return &SendError{Name: d.Name, Kind: d.Kind, Target: d.Target(), StatusCode: status, Err: err}
	}
	if err := n.Validate(); err != nil {
		return fail(0, err)
	}
	body, err := n.Body()
	if err != nil {
		return fail(0, err)
	}
	switch d.Kind {
	case KindWebhook:
		status, err := s.post(ctx, d, n, body)
		if err != nil || status/100 != 2 {
			return fail(status, err)
		}
		return nil
	case KindSNS:
		if err := s.publish(ctx, d, n, body); err != nil {
			return fail(0, err)
		}
		return nil
	}
	return fail(0, errors.New("unknown kind of destination"))
}

// post sends the signed POST and returns the answer's status.
func (s *Sender) post(ctx context.Context, d Destination, n Notification, body []byte) (int, error) {
	if len(d.Secret) < MinSecretLen {
		return 0, fmt.Errorf("the webhook's secret is shorter than %d bytes", MinSecretLen)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(body))
	if err != nil {
		return 0, errors.New("the webhook's URL is not valid") // the error quotes the URL
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	sig, ts := Sign([]byte(d.Secret), body, now())
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderEvent, n.Outcome.Event())
	req.Header.Set(HeaderIdempotencyKey, n.IdempotencyKey)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, sig)

	client := http.Client{Timeout: DefaultTimeout}
	if s.HTTP != nil {
		client = *s.HTTP
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Do(req)
	if err != nil {
		return 0, transportError(err)
	}
	defer resp.Body.Close()
	// Read a little of the answer so the connection can be reused; its
	// content is not reported.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 == 3 {
		return resp.StatusCode, errors.New("a redirect (not followed)")
	}
	return resp.StatusCode, nil
}

// transportError strips the *url.Error of a failed request, whose text
// quotes the whole URL (userinfo and query included), keeping its cause.
func transportError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if ue.Timeout() {
			return fmt.Errorf("POST timed out: %w", ue.Err)
		}
		return fmt.Errorf("POST: %w", ue.Err)
	}
	return err
}

// publish publishes body to d's topic.
func (s *Sender) publish(ctx context.Context, d Destination, n Notification, body []byte) error {
	if s.SNS == nil {
		return errors.New("no SNS client")
	}
	_, err := s.SNS.Publish(ctx, PublishInput(d.TopicARN, n, body))
	return err
}

// PublishInput is the Publish of n (body, its JSON) to topicARN: the body
// as message, a short subject, the String attributes idempotency_key,
// outcome and tenant_id, and for a FIFO topic a message group (the tenant
// and the batch) and a deduplication id (the SHA-256 of the idempotency
// key).
func PublishInput(topicARN string, n Notification, body []byte) *sns.PublishInput {
	str := func(v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	in := &sns.PublishInput{
		TopicArn: aws.String(topicARN),
		Message:  aws.String(string(body)),
		Subject:  aws.String(fmt.Sprintf("fleet batch %d %s", n.BatchID, n.Outcome)),
		MessageAttributes: map[string]types.MessageAttributeValue{
			"idempotency_key": str(n.IdempotencyKey),
			"outcome":         str(string(n.Outcome)),
			"tenant_id":       str(n.TenantID),
		},
	}
	if isFIFO(topicARN) {
		in.MessageGroupId = aws.String(MessageGroupID(n.TenantID, n.BatchID))
		in.MessageDeduplicationId = aws.String(DeduplicationID(n.IdempotencyKey))
	}
	return in
}

// DeduplicationID is the FIFO deduplication id of a notification: the hex
// SHA-256 of its idempotency key (64 characters; SNS allows 128).
func DeduplicationID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// MessageGroupID is the FIFO message group of a batch's notifications:
// "<tenant>:<batch id>", the tenant percent-encoded where SNS does not allow
// a character (it allows ASCII letters, digits and punctuation, tenant ids
// may also hold other letters and spaces); a tenant too long for SNS's 128
// characters is replaced by the hex SHA-256 of its id.
func MessageGroupID(tenant string, batchID int64) string {
	id := ":" + strconv.FormatInt(batchID, 10)
	var b strings.Builder
	for i := 0; i < len(tenant); i++ {
		c := tenant[i]
		if c > ' ' && c < 0x7f && c != '%' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	if b.Len()+len(id) > 128 {
		sum := sha256.Sum256([]byte(tenant))
		return hex.EncodeToString(sum[:]) + id
	}
	return b.String() + id
}
