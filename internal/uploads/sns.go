package uploads

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha1" //nolint:gosec // SNS SignatureVersion 1 is SHA1withRSA
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// SNS message types.
const (
	snsNotification             = "Notification"
	snsSubscriptionConfirmation = "SubscriptionConfirmation"
	snsUnsubscribeConfirmation  = "UnsubscribeConfirmation"
)

// Defaults of SNSConfig.
const (
	// SNSMaxAgeDefault bounds the age of an SNS message: an hour, the
	// longest SNS keeps retrying a delivery.
	SNSMaxAgeDefault = time.Hour
	snsFetchTimeout  = 10 * time.Second
	snsMaxCertBytes  = 64 << 10
	snsMaxCachedCert = 64
)

// snsHost matches the hosts of Amazon SNS, the only hosts a signing
// certificate is fetched from and a subscription is confirmed at.
var snsHost = regexp.MustCompile(`^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$`)

// SNSConfig authenticates /v1/events/s3 requests by their Amazon SNS
// message signature: Amazon SNS can send neither a bearer token nor the
// HMAC headers. A signature proves only that SNS sent the message, and any
// AWS account can have SNS sign messages, so notifications are accepted
// only from the topics listed in TopicARNs.
type SNSConfig struct {
	// TopicARNs are the topics whose notifications are accepted. Required.
	TopicARNs []string
	// AutoConfirm confirms subscriptions to TopicARNs by fetching their
	// SubscribeURL (only ever on an Amazon SNS host). Without it, a
	// subscription confirmation is logged and counted for an operator.
	AutoConfirm bool
	// MaxAge bounds a message's age. Defaults to SNSMaxAgeDefault.
	MaxAge time.Duration
	// HTTPClient fetches signing certificates and confirms subscriptions.
	// Its TLS roots are the trust anchor: a certificate is trusted because
	// it came over HTTPS from an Amazon SNS host. Defaults to a client with
	// the system roots, a 10 s timeout and no redirects; tests inject one
	// trusting a CA of their own.
	HTTPClient *http.Client
}

// snsMessage is an Amazon SNS HTTP(S) delivery.
type snsMessage struct {
	Type             string
	MessageID        string
	Token            string
	TopicArn         string
	Subject          *string // signed only when present
	Message          string
	Timestamp        string
	SignatureVersion string
	Signature        string
	SigningCertURL   string
	SubscribeURL     string
}

// parseSNS reads body as an SNS message; false if it is none (no Type).
func parseSNS(body []byte) (snsMessage, bool) {
	var m struct {
		Type             string  `json:"Type"`
		MessageID        string  `json:"MessageId"`
		Token            string  `json:"Token"`
		TopicArn         string  `json:"TopicArn"`
		Subject          *string `json:"Subject"`
		Message          string  `json:"Message"`
		Timestamp        string  `json:"Timestamp"`
		SignatureVersion string  `json:"SignatureVersion"`
		Signature        string  `json:"Signature"`
		SigningCertURL   string  `json:"SigningCertURL"`
		SubscribeURL     string  `json:"SubscribeURL"`
	}
	if err := json.Unmarshal(body, &m); err != nil || m.Type == "" {
		return snsMessage{}, false
	}
	return snsMessage(m), true
}

// stringToSign is the canonical text SNS signs: name, newline, value,
// newline, for a fixed list of fields in byte order, which differs between
// notifications and (un)subscription confirmations.
func (m snsMessage) stringToSign() (string, error) {
	var b strings.Builder
	add := func(name, value string) { b.WriteString(name + "\n" + value + "\n") }
	switch m.Type {
	case snsNotification:
		add("Message", m.Message)
		add("MessageId", m.MessageID)
		if m.Subject != nil {
			add("Subject", *m.Subject)
		}
		add("Timestamp", m.Timestamp)
		add("TopicArn", m.TopicArn)
		add("Type", m.Type)
	case snsSubscriptionConfirmation, snsUnsubscribeConfirmation:
		add("Message", m.Message)
		add("MessageId", m.MessageID)
		add("SubscribeURL", m.SubscribeURL)
		add("Timestamp", m.Timestamp)
		add("Token", m.Token)
		add("TopicArn", m.TopicArn)
		add("Type", m.Type)
	default:
		return "", fmt.Errorf("unknown SNS message type %q", m.Type)
	}
	return b.String(), nil
}

// snsURL parses u and checks it is https on an Amazon SNS host.
func snsURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("unparsable URL")
	}
	if u.Scheme != "https" || u.User != nil || u.Port() != "" || !snsHost.MatchString(u.Hostname()) {
		return nil, fmt.Errorf("URL is not https on an Amazon SNS host: %q", u.Redacted())
	}
	return u, nil
}

// snsVerifier verifies SNS message signatures, caching certificates.
type snsVerifier struct {
	cfg    SNSConfig
	client *http.Client

	mu    sync.Mutex
	certs map[string]*x509.Certificate
}

// validate checks the accepted topics.
func (cfg SNSConfig) validate() error {
	if len(cfg.TopicARNs) == 0 {
		return errors.New("SNS authentication needs at least one accepted topic ARN")
	}
	for _, arn := range cfg.TopicARNs {
		if !strings.HasPrefix(arn, "arn:aws") || strings.Count(arn, ":") != 5 {
			return fmt.Errorf("%q is not an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:TOPIC)", arn)
		}
	}
	return nil
}

func newSNSVerifier(cfg SNSConfig) (*snsVerifier, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("uploads: %w", err)
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = SNSMaxAgeDefault
	}
	client := cfg.HTTPClient
	if client == nil {
		client = &http.Client{Timeout: snsFetchTimeout}
	}
	// Never follow a redirect: it could leave the SNS host.
	noRedirect := *client
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &snsVerifier{cfg: cfg, client: &noRedirect, certs: map[string]*x509.Certificate{}}, nil
}

func (v *snsVerifier) topicAccepted(arn string) bool { return slices.Contains(v.cfg.TopicARNs, arn) }

// verify checks m's signature, age and signing certificate; nil means SNS
// sent m. The error says why not.
func (v *snsVerifier) verify(ctx context.Context, m snsMessage) error {
	var hash crypto.Hash
	switch m.SignatureVersion {
	case "1":
		hash = crypto.SHA1
	case "2":
		hash = crypto.SHA256
	default:
		return fmt.Errorf("unsupported SignatureVersion %q", m.SignatureVersion)
	}
	ts, err := time.Parse(time.RFC3339Nano, m.Timestamp)
	if err != nil {
		return errors.New("bad Timestamp")
	}
	if age := time.Since(ts); age > v.cfg.MaxAge || age < -time.Minute {
		return errors.New("message expired")
	}
	sig, err := base64.StdEncoding.DecodeString(m.Signature)
	if err != nil || len(sig) == 0 {
		return errors.New("bad Signature encoding")
	}
	text, err := m.stringToSign()
	if err != nil {
		return err
	}
	cert, err := v.certificate(ctx, m.SigningCertURL)
	if err != nil {
		return fmt.Errorf("signing certificate: %w", err)
	}
	pub, ok := cert.PublicKey.(*rsa.PublicKey)
	if !ok {
		return errors.New("signing certificate has no RSA key")
	}
	var digest []byte
	if hash == crypto.SHA1 {
		d := sha1.Sum([]byte(text)) //nolint:gosec // required by SignatureVersion 1
		digest = d[:]
	} else {
		d := sha256.Sum256([]byte(text))
		digest = d[:]
	}
	if err := rsa.VerifyPKCS1v15(pub, hash, digest, sig); err != nil {
		return errors.New("bad signature")
	}
	return nil
}

// snsReplayKey is the replay key of a verified message: the bytes of its
// signature, not their base64 text. The decoder skips line breaks and
// ignores the unused bits of the last character, so one signature has many
// spellings that all verify; keyed on the text, each would be a new
// message.
func snsReplayKey(m snsMessage) string {
	sig, _ := base64.StdEncoding.DecodeString(m.Signature) // verified: it decodes
	return "sns:" + string(sig)
}

// certificate returns the certificate at raw, fetched over HTTPS from an
// Amazon SNS host and cached until it expires.
func (v *snsVerifier) certificate(ctx context.Context, raw string) (*x509.Certificate, error) {
	u, err := snsURL(raw)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(u.Path, ".pem") || u.RawQuery != "" {
		return nil, fmt.Errorf("not a certificate URL: %q", u.Redacted())
	}
	key := u.String()
	now := time.Now()
	v.mu.Lock()
	cert, ok := v.certs[key]
	v.mu.Unlock()
	if ok && now.Before(cert.NotAfter) {
		return cert, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, key, nil)
	if err != nil {
		return nil, err
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", key, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetching %s: HTTP %d", key, resp.StatusCode)
	}
	raw2, err := io.ReadAll(io.LimitReader(resp.Body, snsMaxCertBytes))
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", key, err)
	}
	block, _ := pem.Decode(raw2)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s holds no PEM certificate", key)
	}
	cert, err = x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return nil, fmt.Errorf("%s: certificate not valid now", key)
	}
	v.mu.Lock()
	if len(v.certs) >= snsMaxCachedCert {
		clear(v.certs)
	}
	v.certs[key] = cert
	v.mu.Unlock()
	return cert, nil
}

// confirm confirms a subscription by fetching its SubscribeURL, only ever
// on an Amazon SNS host.
func (v *snsVerifier) confirm(ctx context.Context, m snsMessage) error {
	u, err := snsURL(m.SubscribeURL)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return fmt.Errorf("confirming: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("confirming: HTTP %d", resp.StatusCode)
	}
	return nil
}
