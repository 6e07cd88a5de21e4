package uploads

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha1" //nolint:gosec // SNS SignatureVersion 1 is SHA1withRSA
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
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

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"

	"github.com/fleet/ingest/internal/s3events"
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
// certificate is fetched from and a subscription is confirmed at:
// sns.REGION.amazonaws.com, or sns.REGION.amazonaws.com.cn for the China
// regions, where REGION looks like an AWS region (us-east-1,
// us-gov-west-1, cn-north-1), not any label (sns.s3.amazonaws.com is an S3
// bucket's virtual host, whose content anyone with that bucket writes).
var snsHost = regexp.MustCompile(`^sns\.(` + awsRegion + `)\.amazonaws\.com(\.cn)?$`)

// awsRegion matches an AWS region name: us-east-1, us-gov-west-1,
// cn-north-1, us-isob-east-1.
const awsRegion = `[a-z]{2}(?:-gov|-iso[a-z]*)?-[a-z]+-[0-9]+`

// snsTopicARN matches an SNS topic ARN, arn:PARTITION:sns:REGION:ACCOUNT:NAME,
// and captures its region.
var snsTopicARN = regexp.MustCompile(`^arn:aws[a-z-]*:sns:(` + awsRegion + `):[0-9]{12}:[A-Za-z0-9_-]{1,256}(?:\.fifo)?$`)

// snsCertPath matches the path of a signing certificate: one segment
// ending in .pem (SNS's are /SimpleNotificationService-HEX.pem).
var snsCertPath = regexp.MustCompile(`^/[A-Za-z0-9._-]+\.pem$`)

// Certificate fetches, per accepted topic. A budget: at most
// snsCertFetchesPerSecond fetches that bring a certificate of SNS on
// average, a burst of snsCertFetchBurst; a fetch that brings none (the URL
// answers 404, holds no certificate, or one not SNS's; the host cannot be
// reached) gives its share back. And at most snsCertFetchesInFlight
// fetches in flight at once, whatever they bring, one per URL: a fetch
// beyond them waits for one to end (up to snsFetchTimeout).
//
// So forged deliveries naming an accepted topic, which an unauthenticated
// client can send without end, each naming a certificate URL of the
// topic's SNS host that does not exist, cannot spend the topic's budget:
// they can only take turns at its fetches in flight with the genuine
// delivery whose certificate is not cached yet, which is fetched in its
// turn. They used to spend the budget, and the genuine delivery that
// followed them was answered 503 until it refilled. What spends it is a
// certificate SNS really serves, which is then cached (until it expires):
// there are few, and none an attacker can make. A fetch is needed only
// for a certificate not cached, which real SNS deliveries rarely need
// (SNS rotates its certificate a few times a year).
const (
	snsCertFetchesPerSecond = 2
	snsCertFetchBurst       = 4
	snsCertFetchesInFlight  = 4
)

// errSNSCertFetchLimited is returned by verify when a certificate would
// have to be fetched beyond the budget, or no fetch of the topic ended in
// time for this one to start: the sender should retry later.
var errSNSCertFetchLimited = errors.New("signing certificate fetches are rate limited: retry later")

// errSNSCertUnavailable is wrapped by verify when the signing certificate
// could not be fetched for a reason that may pass (the connection failed,
// timed out or was cut; the host answered 5xx or 429). Such a message is
// answered 503, so SNS delivers it again, instead of 401, after which SNS
// would drop it: a network blip must not lose an upload.
var errSNSCertUnavailable = errors.New("signing certificate unavailable for now: retry later")

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

// snsRegionHost checks that u is https on an Amazon SNS host, with no user
// information and no port, and returns its host, lower-cased, and region.
func snsRegionHost(u *url.URL) (host, region string, err error) {
	host = strings.ToLower(u.Hostname())
	match := snsHost.FindStringSubmatch(host)
	if u.Scheme != "https" || u.User != nil || u.Port() != "" || u.Opaque != "" || match == nil ||
		(match[2] == ".cn") != strings.HasPrefix(match[1], "cn-") {
		return "", "", fmt.Errorf("URL is not https on an Amazon SNS host: %q", u.Redacted())
	}
	return host, match[1], nil
}

// snsURL parses raw, a SubscribeURL, and checks it is https on an Amazon
// SNS host, without a fragment.
func snsURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("unparsable URL")
	}
	if _, _, err := snsRegionHost(u); err != nil {
		return nil, err
	}
	if u.Fragment != "" || u.RawFragment != "" || strings.Contains(raw, "#") {
		return nil, fmt.Errorf("URL with a fragment: %q", u.Redacted())
	}
	return u, nil
}

// snsCertURL returns the normal form of a SigningCertURL, the key of the
// certificate cache and the only URL fetched: https://HOST/NAME.pem, the
// host lower-cased. It refuses what SNS never sends, rather than dropping
// it: a query, a fragment, user information, a port, an escaped or
// multi-segment path. So no spelling of one URL is a cache miss.
func snsCertURL(raw string) (certURL, region string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", fmt.Errorf("unparsable URL")
	}
	host, region, err := snsRegionHost(u)
	if err != nil {
		return "", "", err
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.ContainsAny(raw, "?#") || u.RawPath != "" || !snsCertPath.MatchString(u.Path) {
		return "", "", fmt.Errorf("not a certificate URL: %q", u.Redacted())
	}
	return "https://" + host + u.Path, region, nil
}

// snsSigningNames are the names an SNS signing certificate for region may
// carry (as its subject's common name or a DNS name), as the AWS SDK for
// Java's SnsMessageManager expects them (SnsHostProvider): sns.amazonaws.com
// in most regions, sns-signing.REGION.amazonaws.com in the opt-in ones,
// sns-REGION.amazonaws.com.cn in China, sns-us-gov-west-1.amazonaws.com in
// GovCloud. A certificate served from an SNS host but naming none of
// these is not SNS's.
func snsSigningNames(region string) []string {
	if strings.HasPrefix(region, "cn-") {
		return []string{"sns-" + region + ".amazonaws.com.cn", "sns-signing." + region + ".amazonaws.com.cn"}
	}
	names := []string{"sns.amazonaws.com", "sns-signing." + region + ".amazonaws.com"}
	if strings.HasPrefix(region, "us-gov-") {
		names = append(names, "sns-us-gov-west-1.amazonaws.com", "sns-"+region+".amazonaws.com")
	}
	return names
}

// namesSNS reports whether cert's subject common name or one of its DNS
// names is one of names.
func namesSNS(cert *x509.Certificate, names []string) bool {
	if slices.Contains(names, strings.ToLower(cert.Subject.CommonName)) {
		return true
	}
	for _, dns := range cert.DNSNames {
		if slices.Contains(names, strings.ToLower(dns)) {
			return true
		}
	}
	return false
}

// snsVerifier verifies SNS message signatures, caching certificates by
// their normal URL (snsCertURL). Certificates are fetched only for an
// accepted topic, only from the SNS host of the topic's own region, and
// within the topic's own budget and fetches in flight (never more than one
// per topic and URL; see snsCertFetchesInFlight): forged deliveries naming
// other topics, or other regions' hosts, are refused before anything is
// fetched, and forged deliveries naming certificates SNS does not serve
// cannot spend an accepted topic's budget.
//
// The certificates are not fetched at start: SNS names its signing
// certificate only in the messages it signs (SigningCertURL, a file name
// that changes when SNS rotates the certificate), and publishes no other
// way to know it, so the first delivery after a start (or a rotation)
// fetches it, within its topic's budget.
type snsVerifier struct {
	cfg     SNSConfig
	client  *http.Client
	topics  map[string]*snsTopic
	flights singleflight.Group

	mu    sync.Mutex
	certs map[string]*x509.Certificate
}

// snsTopic is an accepted topic: the region whose SNS host signs its
// messages, its own budget of certificate fetches and its fetches in
// flight.
type snsTopic struct {
	region  string
	fetches *rate.Limiter
	// inFlight holds a token per certificate fetch in flight.
	inFlight chan struct{}
}

// validate checks the accepted topics.
func (cfg SNSConfig) validate() error {
	if len(cfg.TopicARNs) == 0 {
		return errors.New("SNS authentication needs at least one accepted topic ARN")
	}
	for _, arn := range cfg.TopicARNs {
		if !snsTopicARN.MatchString(arn) {
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
	topics := make(map[string]*snsTopic, len(cfg.TopicARNs))
	for _, arn := range cfg.TopicARNs {
		topics[arn] = &snsTopic{region: snsTopicARN.FindStringSubmatch(arn)[1],
			fetches:  rate.NewLimiter(snsCertFetchesPerSecond, snsCertFetchBurst),
			inFlight: make(chan struct{}, snsCertFetchesInFlight)}
	}
	return &snsVerifier{cfg: cfg, client: &noRedirect, certs: map[string]*x509.Certificate{}, topics: topics}, nil
}

func (v *snsVerifier) topicAccepted(arn string) bool { return v.topics[arn] != nil }

// verify checks m's signature, age and signing certificate; nil means SNS
// sent m. The error says why not.
func (v *snsVerifier) verify(ctx context.Context, m s3events.SNSMessage) error {
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
	text, err := m.StringToSign()
	if err != nil {
		return err
	}
	topic := v.topics[m.TopicArn]
	if topic == nil {
		// The callers look the topic up first; nothing is fetched for
		// another.
		return fmt.Errorf("SNS topic %q is not accepted", m.TopicArn)
	}
	cert, err := v.certificate(ctx, m.TopicArn, topic, m.SigningCertURL)
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
func snsReplayKey(m s3events.SNSMessage) string {
	sig, _ := base64.StdEncoding.DecodeString(m.Signature) // verified: it decodes
	return "sns:" + string(sig)
}

// certificate returns the certificate at raw for a message of topic (the
// accepted topic arn), fetched over HTTPS from the Amazon SNS host of the
// topic's region, naming SNS (snsSigningNames), and cached until it
// expires. A URL on another region's host is refused without a fetch.
// Concurrent requests of one topic for one URL share one fetch; a fetch
// waits for a turn among the topic's fetches in flight, and fails with
// errSNSCertFetchLimited beyond the topic's budget (which only fetches
// that bring a certificate of SNS spend) or when no turn came in time.
func (v *snsVerifier) certificate(ctx context.Context, arn string, topic *snsTopic, raw string) (*x509.Certificate, error) {
	key, region, err := snsCertURL(raw)
	if err != nil {
		return nil, err
	}
	if region != topic.region {
		// SNS signs a topic's messages in the topic's region; a forged
		// message naming another host must not spend the topic's fetches.
		return nil, fmt.Errorf("%s is not on the SNS host of the topic's region %s", key, topic.region)
	}
	v.mu.Lock()
	cert, ok := v.certs[key]
	v.mu.Unlock()
	if ok && time.Now().Before(cert.NotAfter) {
		return cert, nil
	}
	// One fetch per topic and URL at a time, on behalf of every waiting
	// request: it runs to its own timeout even if the request that started
	// it ends. Keyed by topic too, so a fetch refused by one topic's budget
	// is never another topic's answer.
	ch := v.flights.DoChan(arn+" "+key, func() (any, error) {
		turn := time.NewTimer(snsFetchTimeout)
		defer turn.Stop()
		select {
		case topic.inFlight <- struct{}{}:
		case <-turn.C:
			return nil, errSNSCertFetchLimited
		}
		defer func() { <-topic.inFlight }()
		// The budget is looked at, and spent only once the fetch brought a
		// certificate of SNS. (Up to snsCertFetchesInFlight fetches may
		// pass on its last share at once.)
		if topic.fetches.Tokens() < 1 {
			return nil, errSNSCertFetchLimited
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snsFetchTimeout)
		defer cancel()
		cert, err := v.fetch(fctx, key, region)
		if err != nil {
			return nil, err // it brought no certificate of SNS: nothing spent
		}
		topic.fetches.Allow()
		v.mu.Lock()
		if len(v.certs) >= snsMaxCachedCert {
			clear(v.certs)
		}
		v.certs[key] = cert
		v.mu.Unlock()
		return cert, nil
	})
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.(*x509.Certificate), nil
	}
}

// fetch GETs the certificate at key, a normal certificate URL, and checks
// it is valid now and names SNS for region.
func (v *snsVerifier) fetch(ctx context.Context, key, region string) (*x509.Certificate, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, key, nil)
	if err != nil {
		return nil, err
	}
	resp, err := v.client.Do(req)
	var untrusted *tls.CertificateVerificationError
	switch {
	case errors.As(err, &untrusted):
		// Not an outage: the host is not the SNS host it names.
		return nil, fmt.Errorf("fetching %s: %w", key, err)
	case err != nil:
		return nil, fmt.Errorf("%w: fetching %s: %v", errSNSCertUnavailable, key, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return nil, fmt.Errorf("%w: fetching %s: HTTP %d", errSNSCertUnavailable, key, resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("fetching %s: HTTP %d", key, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, snsMaxCertBytes))
	if err != nil {
		return nil, fmt.Errorf("%w: fetching %s: %v", errSNSCertUnavailable, key, err)
	}
	block, _ := pem.Decode(body)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s holds no PEM certificate", key)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	if now := time.Now(); now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return nil, fmt.Errorf("%s: certificate not valid now", key)
	}
	if names := snsSigningNames(region); !namesSNS(cert, names) {
		return nil, fmt.Errorf("%s: certificate is not SNS's: its subject %q names none of %s", key, cert.Subject.CommonName, strings.Join(names, ", "))
	}
	return cert, nil
}

// confirm confirms a subscription by fetching its SubscribeURL, only ever
// on an Amazon SNS host.
func (v *snsVerifier) confirm(ctx context.Context, m s3events.SNSMessage) error {
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
