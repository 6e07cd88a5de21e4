package uploads

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1" //nolint:gosec // SNS SignatureVersion 1
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/s3events"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// fakeSNS stands in for the Amazon SNS hosts: a TLS server whose
// certificate, for sns.*.amazonaws.com names, is issued by a CA made here;
// it serves a signing certificate issued by the same CA and records
// subscription confirmations. Its client trusts only that CA and dials the
// server whatever the host — except sns.ap-south-1.amazonaws.com, which
// leads to a server with a certificate nobody trusts. Its signing
// certificate names sns.amazonaws.com, as Amazon's do; /attacker.pem is a
// certificate for the same key naming attacker.example instead. Paths
// /missing-*.pem answer 404. It does not emulate SNS delivery policies or
// certificate rotation.
type fakeSNS struct {
	signKey  *rsa.PrivateKey
	client   *http.Client
	fetches  atomic.Int64
	mu       sync.Mutex
	confirms []url.Values
	// gate, if set, holds every certificate fetch until it is closed.
	gate chan struct{}
	// fail, while set, makes certificate fetches fail: "500" answers HTTP
	// 500, "cut" closes the connection without an answer.
	fail atomic.Value
}

const (
	testTopic   = "arn:aws:sns:us-east-1:123456789012:fleet-uploads"
	otherTopic  = "arn:aws:sns:us-east-1:999999999999:someone-else"
	testCertURL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0123abcd.pem"
	// euTopic and southTopic are accepted too, in other regions; the fake
	// SNS answers for eu-west-1 and, untrusted, for ap-south-1.
	euTopic    = "arn:aws:sns:eu-west-1:123456789012:fleet-uploads-eu"
	southTopic = "arn:aws:sns:ap-south-1:123456789012:fleet-uploads-south"
)

func newFakeSNS(t *testing.T) *fakeSNS {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleet test SNS CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	issue := func(serial int64, tmpl *x509.Certificate, pub any) []byte {
		tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = big.NewInt(serial), now.Add(-time.Hour), now.Add(24*time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
		require.NoError(t, err)
		return der
	}
	tlsKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tlsDER := issue(2, &x509.Certificate{
		Subject:  pkix.Name{CommonName: "sns.us-east-1.amazonaws.com"},
		DNSNames: []string{"sns.us-east-1.amazonaws.com", "sns.eu-west-1.amazonaws.com", "sns.cn-north-1.amazonaws.com.cn"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, &tlsKey.PublicKey)
	signKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	signDER := issue(3, &x509.Certificate{Subject: pkix.Name{CommonName: "sns.amazonaws.com"}, KeyUsage: x509.KeyUsageDigitalSignature}, &signKey.PublicKey)
	signPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: signDER})
	attackerDER := issue(4, &x509.Certificate{Subject: pkix.Name{CommonName: "attacker.example"}, DNSNames: []string{"attacker.example"}, KeyUsage: x509.KeyUsageDigitalSignature}, &signKey.PublicKey)
	attackerPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: attackerDER})

	f := &fakeSNS{signKey: signKey}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, ".pem"):
			f.fetches.Add(1)
			if f.gate != nil {
				<-f.gate
			}
			switch f.fail.Load() {
			case "500":
				http.Error(w, "internal error", http.StatusInternalServerError)
				return
			case "cut":
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					_ = conn.Close()
				}
				return
			}
			switch {
			case r.URL.Path == "/attacker.pem":
				_, _ = w.Write(attackerPEM)
			case strings.HasPrefix(r.URL.Path, "/missing-"):
				http.NotFound(w, r)
			default:
				_, _ = w.Write(signPEM)
			}
		case r.URL.Query().Get("Action") == "ConfirmSubscription":
			f.mu.Lock()
			f.confirms = append(f.confirms, r.URL.Query())
			f.mu.Unlock()
			fmt.Fprint(w, "<ConfirmSubscriptionResponse/>")
		default:
			http.NotFound(w, r)
		}
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{tlsDER}, PrivateKey: tlsKey}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	untrusted := httptest.NewTLSServer(srv.Config.Handler) // its own certificate, from no CA we trust
	t.Cleanup(untrusted.Close)

	roots := x509.NewCertPool()
	roots.AddCert(ca)
	f.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			target := srv.Listener.Addr().String()
			if strings.HasPrefix(addr, "sns.ap-south-1.") {
				target = untrusted.Listener.Addr().String()
			}
			return (&net.Dialer{}).DialContext(ctx, network, target)
		},
	}}
	return f
}

func (f *fakeSNS) confirmations() []url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]url.Values(nil), f.confirms...)
}

// message builds an SNS delivery of type typ; mod may change fields before
// it is signed with SignatureVersion version (unsigned when version is "").
func (f *fakeSNS) message(t *testing.T, typ, topic, body, version string, mod func(*s3events.SNSMessage)) []byte {
	t.Helper()
	m := s3events.SNSMessage{
		Type: typ, MessageID: fmt.Sprintf("m-%d", time.Now().UnixNano()), TopicArn: topic, Message: body,
		Timestamp: time.Now().UTC().Format("2006-01-02T15:04:05.000Z"), SignatureVersion: version, SigningCertURL: testCertURL,
	}
	if typ != s3events.SNSNotification {
		m.Token = "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f7"
		m.SubscribeURL = "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=" + url.QueryEscape(topic) + "&Token=" + m.Token
	}
	if mod != nil {
		mod(&m)
	}
	if version != "" {
		text, err := m.StringToSign()
		require.NoError(t, err)
		var sig []byte
		if version == "1" {
			d := sha1.Sum([]byte(text)) //nolint:gosec // SignatureVersion 1
			sig, err = rsa.SignPKCS1v15(rand.Reader, f.signKey, crypto.SHA1, d[:])
		} else {
			d := sha256.Sum256([]byte(text))
			sig, err = rsa.SignPKCS1v15(rand.Reader, f.signKey, crypto.SHA256, d[:])
		}
		require.NoError(t, err)
		m.Signature = base64.StdEncoding.EncodeToString(sig)
	}
	out := map[string]any{
		"Type": m.Type, "MessageId": m.MessageID, "TopicArn": m.TopicArn, "Message": m.Message, "Timestamp": m.Timestamp,
		"SignatureVersion": m.SignatureVersion, "Signature": m.Signature, "SigningCertURL": m.SigningCertURL,
		"UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=" + topic + ":x",
	}
	if m.Subject != nil {
		out["Subject"] = *m.Subject
	}
	if typ != s3events.SNSNotification {
		out["Token"], out["SubscribeURL"] = m.Token, m.SubscribeURL
	}
	b, err := json.Marshal(out)
	require.NoError(t, err)
	return b
}

func withSNS(f *fakeSNS, autoConfirm bool, logs *testproc.SyncBuffer) func(*Config) {
	return func(c *Config) {
		c.SNS = &SNSConfig{TopicARNs: []string{testTopic, euTopic, southTopic}, AutoConfirm: autoConfirm, HTTPClient: f.client}
		if logs != nil {
			c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
		}
	}
}

// TestSNSSignedNotifications: Amazon SNS sends neither a token nor our HMAC
// headers; its message signature (versions 1 and 2) authenticates it, from
// an accepted topic, with a certificate fetched over HTTPS from an SNS host
// only (and cached), once.
func TestSNSSignedNotifications(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	sns := newFakeSNS(t)
	f := newServer(t, pool, withSNS(sns, false, nil))
	event := func(folder string) string {
		return string(s3Event("fleet-uploads", "tenants/t1/db1/c1/"+folder+"/_SUCCESS", "ObjectCreated:Put"))
	}
	post := func(body []byte) (int, map[string]any) {
		t.Helper()
		return f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", body, nil)
	}

	subject := "Amazon S3 Notification"
	v1 := sns.message(t, s3events.SNSNotification, testTopic, event("v1"), "1", nil)
	status, out := post(v1)
	require.Equal(t, http.StatusAccepted, status, "SignatureVersion 1: %v", out)
	status, out = post(sns.message(t, s3events.SNSNotification, testTopic, event("v2"), "2", func(m *s3events.SNSMessage) { m.Subject = &subject }))
	require.Equal(t, http.StatusAccepted, status, "SignatureVersion 2, with a Subject: %v", out)
	require.Equal(t, 2, count(t, pool))
	require.Equal(t, int64(1), sns.fetches.Load(), "the signing certificate is fetched once and cached")

	status, out = post(v1)
	require.Equal(t, http.StatusUnauthorized, status)
	require.Contains(t, out["error"], "already used", "a replayed SNS message is refused")

	tamper := func(b []byte) []byte { return bytes.Replace(b, []byte("tenants/t1/"), []byte("tenants/t9/"), 1) }
	for name, tc := range map[string]struct {
		body []byte
		why  string
	}{
		"tampered message": {tamper(sns.message(t, s3events.SNSNotification, testTopic, event("x1"), "2", nil)), "bad signature"},
		"subject added after signing": {func() []byte {
			var m map[string]any
			require.NoError(t, json.Unmarshal(sns.message(t, s3events.SNSNotification, testTopic, event("x2"), "1", nil), &m))
			m["Subject"] = "added"
			b, _ := json.Marshal(m)
			return b
		}(), "bad signature"},
		"topic not accepted":    {sns.message(t, s3events.SNSNotification, otherTopic, event("x3"), "2", nil), "is not accepted"},
		"unknown version":       {sns.message(t, s3events.SNSNotification, testTopic, event("x4"), "", func(m *s3events.SNSMessage) { m.SignatureVersion, m.Signature = "3", "AAAA" }), "unsupported SignatureVersion"},
		"too old":               {sns.message(t, s3events.SNSNotification, testTopic, event("x5"), "2", func(m *s3events.SNSMessage) { m.Timestamp = time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339) }), "expired"},
		"certificate over http": {sns.message(t, s3events.SNSNotification, testTopic, event("x6"), "2", func(m *s3events.SNSMessage) { m.SigningCertURL = strings.Replace(testCertURL, "https", "http", 1) }), "not https on an Amazon SNS host"},
		"certificate elsewhere": {sns.message(t, s3events.SNSNotification, testTopic, event("x7"), "2", func(m *s3events.SNSMessage) {
			m.SigningCertURL = "https://sns.us-east-1.amazonaws.com.evil.example/x.pem"
		}), "not https on an Amazon SNS host"},
		"certificate lookalike": {sns.message(t, s3events.SNSNotification, testTopic, event("x8"), "2", func(m *s3events.SNSMessage) {
			m.SigningCertURL = "https://evil.example/sns.us-east-1.amazonaws.com/x.pem"
		}), "not https on an Amazon SNS host"},
		"certificate with a port": {sns.message(t, s3events.SNSNotification, testTopic, event("x9"), "2", func(m *s3events.SNSMessage) { m.SigningCertURL = "https://sns.us-east-1.amazonaws.com:8443/x.pem" }), "not https on an Amazon SNS host"},
		"certificate not trusted": {sns.message(t, s3events.SNSNotification, southTopic, event("xa"), "2", func(m *s3events.SNSMessage) { m.SigningCertURL = "https://sns.ap-south-1.amazonaws.com/x.pem" }), "certificate"},
		"another region's host":   {sns.message(t, s3events.SNSNotification, testTopic, event("xd"), "2", func(m *s3events.SNSMessage) { m.SigningCertURL = "https://sns.eu-west-1.amazonaws.com/x.pem" }), "not on the SNS host of the topic's region us-east-1"},
		"certificate not a .pem":  {sns.message(t, s3events.SNSNotification, testTopic, event("xb"), "2", func(m *s3events.SNSMessage) { m.SigningCertURL = "https://sns.us-east-1.amazonaws.com/?Action=Publish" }), "not a certificate URL"},
		"no signature, no token":  {sns.message(t, s3events.SNSNotification, testTopic, event("xc"), "", nil), "missing credentials"},
	} {
		status, out := post(tc.body)
		require.Equal(t, http.StatusUnauthorized, status, "%s: %v", name, out)
		require.Contains(t, out["error"], tc.why, name)
	}
	require.Equal(t, 2, count(t, pool), "refused messages write nothing")
	require.Equal(t, int64(1), sns.fetches.Load(), "no certificate was fetched from anywhere but an SNS host")
}

// TestSNSSubscriptionConfirmation: a signed confirmation is logged with its
// topic and counted; it is confirmed (GET SubscribeURL on an SNS host) only
// with auto-confirm and an accepted topic.
func TestSNSSubscriptionConfirmation(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	sns := newFakeSNS(t)
	logs := &testproc.SyncBuffer{}
	auto := newServer(t, pool, withSNS(sns, true, logs))
	manual := newServer(t, pool, withSNS(sns, false, nil))
	post := func(f *fixture, body []byte) (int, map[string]any) {
		t.Helper()
		return f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", body, nil)
	}
	confirmation := sns.message(t, s3events.SNSSubscriptionConfirmation, testTopic, "You have chosen to subscribe to the topic "+testTopic, "2", nil)

	status, out := post(auto, confirmation)
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, "confirmed", out["outcome"])
	require.Len(t, sns.confirmations(), 1)
	require.Equal(t, testTopic, sns.confirmations()[0].Get("TopicArn"))
	require.Contains(t, logs.String(), `"msg":"SNS subscription confirmed"`)
	require.Contains(t, logs.String(), `"topic_arn":"`+testTopic+`"`)
	require.NotContains(t, logs.String(), "2336412f37fb", "the subscription token is not logged")
	require.Equal(t, float64(1), snsCounter(t, auto, "confirmed"))

	// Another topic: logged and counted, never verified (no certificate
	// fetched for it), never confirmed.
	fetched := sns.fetches.Load()
	status, out = post(auto, sns.message(t, s3events.SNSSubscriptionConfirmation, otherTopic, "subscribe", "1", func(m *s3events.SNSMessage) {
		m.SigningCertURL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-other.pem"
	}))
	require.Equal(t, http.StatusUnauthorized, status, out)
	require.Contains(t, out["error"], "is not accepted")
	require.Contains(t, logs.String(), `"topic_arn":"`+otherTopic+`"`)
	require.Equal(t, float64(1), snsCounter(t, auto, "topic_not_accepted"))
	require.Equal(t, fetched, sns.fetches.Load(), "nothing was fetched for a topic that is not accepted")
	// Without auto-confirm: the same.
	status, _ = post(manual, confirmation)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, float64(1), snsCounter(t, manual, "unconfirmed"))
	require.Len(t, sns.confirmations(), 1)

	// A SubscribeURL off the SNS hosts is never fetched, even signed.
	status, _ = post(auto, sns.message(t, s3events.SNSSubscriptionConfirmation, testTopic, "subscribe", "2", func(m *s3events.SNSMessage) {
		m.SubscribeURL = "https://attacker.example/?Action=ConfirmSubscription&TopicArn=" + testTopic
	}))
	require.Equal(t, http.StatusBadGateway, status)
	require.Equal(t, float64(1), snsCounter(t, auto, "failed"))
	// A forged confirmation is refused and counted.
	status, _ = post(auto, bytes.Replace(confirmation, []byte("You have"), []byte("You hav"), 1))
	require.Equal(t, http.StatusUnauthorized, status)
	require.Equal(t, float64(1), snsCounter(t, auto, "invalid"))
	require.Len(t, sns.confirmations(), 1, "nothing else was confirmed")
	require.Zero(t, count(t, pool))
}

func snsCounter(t *testing.T, f *fixture, outcome string) float64 {
	t.Helper()
	families, err := f.m.Registry.Gather()
	require.NoError(t, err)
	for _, fam := range families {
		if fam.GetName() != "ingest_sns_subscription_confirmations_total" {
			continue
		}
		for _, mt := range fam.GetMetric() {
			if mt.GetLabel()[0].GetValue() == outcome {
				return mt.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series for %s", outcome)
	return 0
}

// TestSNSURLIsOnAnSNSHost: a SubscribeURL is fetched only over https
// from an Amazon SNS host, without user information or a port.
func TestSNSURLIsOnAnSNSHost(t *testing.T) {
	t.Parallel()
	for _, host := range []string{"sns.us-east-1.amazonaws.com", "sns.cn-north-1.amazonaws.com.cn"} {
		_, err := snsURL("https://" + host + "/x.pem")
		require.NoError(t, err, host)
	}
	for _, raw := range []string{"http://sns.us-east-1.amazonaws.com/x.pem", "https://sns.amazonaws.com.evil/x.pem", "https://user@sns.us-east-1.amazonaws.com/x.pem",
		"https://s3.us-east-1.amazonaws.com/x.pem", "https://SNS.us-east-1.amazonaws.com:443/x.pem", "https://sns.us-east-1.amazonaws.com.cn.evil/x.pem"} {
		_, err := snsURL(raw)
		require.Error(t, err, raw)
	}
}

// TestSNSReplayWithAnotherSpellingOfTheSignatureIsRefused: base64 decoding
// skips line breaks and ignores the unused bits of the last character, so
// one signature has many spellings that all verify. A captured message
// resent with another spelling is a replay, refused 401.
func TestSNSReplayWithAnotherSpellingOfTheSignatureIsRefused(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	sns := newFakeSNS(t)
	f := newServer(t, pool, withSNS(sns, false, nil))
	captured := sns.message(t, s3events.SNSNotification, testTopic, string(s3Event("fleet-uploads", "tenants/t1/db1/c1/respell/_SUCCESS", "ObjectCreated:Put")), "2", nil)
	respelled := func(respell func(string) string) []byte {
		var m map[string]any
		require.NoError(t, json.Unmarshal(captured, &m))
		m["Signature"] = respell(m["Signature"].(string))
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return b
	}
	status, out := f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", captured, nil)
	require.Equal(t, http.StatusAccepted, status, out)

	for name, respell := range map[string]func(string) string{
		"line feed appended": func(s string) string { return s + "\n" },
		"CRLF inside":        func(s string) string { return s[:64] + "\r\n" + s[64:] },
		"line breaks every 76": func(s string) string {
			var b strings.Builder
			for len(s) > 76 {
				b.WriteString(s[:76] + "\n")
				s = s[76:]
			}
			return b.String() + s
		},
		// A 2048-bit signature is 256 bytes: its last base64 character
		// carries 4 unused bits, which the decoder ignores.
		"unused bits set": func(s string) string {
			const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
			i := strings.TrimRight(s, "=")
			last := strings.IndexByte(alphabet, i[len(i)-1])
			return i[:len(i)-1] + string(alphabet[last^0x1]) + s[len(i):]
		},
	} {
		replay := respelled(respell)
		require.NotEqual(t, captured, replay, name)
		status, out := f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", replay, nil)
		require.Equal(t, http.StatusUnauthorized, status, "%s: %v", name, out)
		require.Contains(t, out["error"], "already used", name)
	}
	require.Equal(t, 1, count(t, pool), "the replays imported nothing")
}

// withField returns the JSON object raw with key set to value, appended
// after its last member, so that the signed members stay as they were.
func withField(t *testing.T, raw []byte, key, value string) []byte {
	t.Helper()
	trimmed := bytes.TrimRight(raw, "}")
	return append(append(trimmed, []byte(","+strconvQuote(key)+":"+value)...), '}')
}

func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// lowerKeys respells every top-level key of raw in lower case; values are
// kept.
func lowerKeys(t *testing.T, raw []byte) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &m))
	out := map[string]json.RawMessage{}
	for k, v := range m {
		out[strings.ToLower(k)] = v
	}
	b, err := json.Marshal(out)
	require.NoError(t, err)
	return b
}

// TestSNSImportsOnlyTheSignedMessage: a validly signed SNS notification
// with a field added beside the signed ones (an unsigned "Records", the
// envelope's keys respelt in lower case with EventBridge fields, a second
// "Message", a key SNS never sends) used to be imported from the unsigned
// part (202), and the genuine delivery was then refused as "signature
// already used". Each is now refused 400 before any signature is claimed;
// the genuine delivery is imported, from its signed Message only. The
// same classification is s3events.ParseS3Event's.
func TestSNSImportsOnlyTheSignedMessage(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	sns := newFakeSNS(t)
	f := newServer(t, pool, withSNS(sns, false, nil))
	signedFolder := "tenants/t1/db1/c1/signed"
	genuine := sns.message(t, s3events.SNSNotification, testTopic, string(s3Event("fleet-uploads", signedFolder+"/_SUCCESS", "ObjectCreated:Put")), "2", nil)
	unsigned := `[{"eventSource":"aws:s3","eventName":"ObjectCreated:Put","s3":{"bucket":{"name":"fleet-uploads"},"object":{"key":"tenants/evil/db1/c1/unsigned/_SUCCESS"}}}]`

	for name, tc := range map[string]struct {
		body []byte
		why  string
	}{
		"unsigned Records added": {withField(t, genuine, "Records", unsigned), "ambiguous"},
		"lower-case envelope with EventBridge fields": {withField(t, withField(t, lowerKeys(t, genuine), "detail-type", `"Object Created"`), "detail",
			`{"bucket":{"name":"fleet-uploads"},"object":{"key":"tenants/evil/db1/c1/eb/_SUCCESS"}}`), "ambiguous"},
		"lower-case envelope":    {lowerKeys(t, genuine), "unknown key"},
		"a second Message":       {withField(t, genuine, "Message", strconvQuote(`{"Records":`+unsigned+`}`)), "duplicate key"},
		"Message respelt":        {withField(t, genuine, "message", strconvQuote(`{"Records":`+unsigned+`}`)), "duplicate key"},
		"a key SNS never sends":  {withField(t, genuine, "Detail", `{}`), "unknown key"},
		"a second object after":  {append(append([]byte{}, genuine...), []byte(`{"Records":`+unsigned+`}`)...), "after the JSON object"},
		"Type and Records alone": {[]byte(`{"Type":"Notification","Records":` + unsigned + `}`), "ambiguous"},
	} {
		status, out := f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", tc.body, nil)
		require.Equal(t, http.StatusBadRequest, status, "%s: %v", name, out)
		require.Contains(t, out["error"], tc.why, name)
		_, err := s3events.ParseS3Event(tc.body)
		require.ErrorIs(t, err, s3events.ErrMalformedEvent, "%s: ParseS3Event agrees", name)
	}
	require.Zero(t, count(t, pool), "nothing was imported from an unsigned field")

	status, out := f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", genuine, nil)
	require.Equal(t, http.StatusAccepted, status, "the genuine delivery is not refused as a replay: %v", out)
	var scope string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT source_scope FROM ingestion_batches`).Scan(&scope))
	require.Contains(t, scope, "s3://fleet-uploads/"+signedFolder, "the signed Message's folder, and only it")

	// The token and the HMAC secret authenticate the whole body: SNS
	// envelopes (without a signature too), plain S3 notifications and
	// EventBridge events still pass them.
	envelope, err := json.Marshal(map[string]string{"Type": "Notification", "MessageId": "m", "TopicArn": testTopic,
		"Message": string(s3Event("fleet-uploads", "tenants/t1/db1/c1/bearer-sns/_SUCCESS", "ObjectCreated:Put")), "Timestamp": time.Now().UTC().Format(time.RFC3339)})
	require.NoError(t, err)
	eventBridge := []byte(`{"version":"0","id":"e","detail-type":"Object Created","source":"aws.s3","account":"1","time":"2026-01-01T00:00:00Z","region":"us-east-1","resources":[],"detail":{"bucket":{"name":"fleet-uploads"},"object":{"key":"tenants/t1/db1/c1/eventbridge/_SUCCESS"}}}`)
	plain := s3Event("fleet-uploads", "tenants/t1/db1/c1/hmac/_SUCCESS", "ObjectCreated:Put")
	for name, tc := range map[string]struct {
		body    []byte
		headers map[string]string
	}{
		"SNS envelope with the token": {envelope, auth},
		"EventBridge with the token":  {eventBridge, auth},
		"S3 notification with HMAC":   {plain, signed(plain)},
		"EventBridge with HMAC":       {bytes.Replace(eventBridge, []byte("eventbridge"), []byte("eventbridge-hmac"), 1), nil},
	} {
		headers := tc.headers
		if headers == nil {
			headers = signed(tc.body)
		}
		status, out := f.post(t, "/v1/events/s3", "application/json", tc.body, headers)
		require.Equal(t, http.StatusAccepted, status, "%s: %v", name, out)
	}
	require.Equal(t, 5, count(t, pool))
}

// TestSNSCertificateURLAndSubject: the SigningCertURL must be
// https://sns.REGION.amazonaws.com[.cn]/NAME.pem with REGION an AWS region
// (sns.s3.amazonaws.com is an S3 bucket's host), nothing else (no
// fragment, query, user, port); one URL is one cache entry whatever its
// host's case; and the certificate fetched must name SNS: one naming
// attacker.example, served from an SNS host and holding the very key that
// signed, is refused.
func TestSNSCertificateURLAndSubject(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"https://sns.s3.amazonaws.com/x.pem", "https://sns.s3-website.amazonaws.com/x.pem", "https://sns.my-bucket.amazonaws.com/x.pem",
		"https://sns.us-east-1.amazonaws.com/x.pem#frag", "https://sns.us-east-1.amazonaws.com/x.pem?", "https://sns.us-east-1.amazonaws.com/x.pem?a=b",
		"https://sns.us-east-1.amazonaws.com/a/b.pem", "https://sns.us-east-1.amazonaws.com/%2e%2e.pem", "https://u:p@sns.us-east-1.amazonaws.com/x.pem",
		"https://sns.us-east-1.amazonaws.com:443/x.pem", "https://sns.cn-north-1.amazonaws.com/x.pem", "https://sns.us-east-1.amazonaws.com.cn/x.pem",
		"http://sns.us-east-1.amazonaws.com/x.pem", "https://sns.us-east-1.amazonaws.com/x.pem.txt",
	} {
		_, _, err := snsCertURL(raw)
		require.Error(t, err, raw)
	}
	for raw, want := range map[string]string{
		"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0123.pem":   "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0123.pem",
		"HTTPS://SNS.US-EAST-1.AMAZONAWS.COM/SimpleNotificationService-0123.pem":   "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0123.pem",
		"https://sns.us-gov-west-1.amazonaws.com/SimpleNotificationService-1.pem":  "https://sns.us-gov-west-1.amazonaws.com/SimpleNotificationService-1.pem",
		"https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-1.pem":  "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-1.pem",
		"https://sns.ap-southeast-7.amazonaws.com/SimpleNotificationService-1.pem": "https://sns.ap-southeast-7.amazonaws.com/SimpleNotificationService-1.pem",
	} {
		got, _, err := snsCertURL(raw)
		require.NoError(t, err, raw)
		require.Equal(t, want, got)
	}

	pool := pgtest.NewPool(t)
	sns := newFakeSNS(t)
	f := newServer(t, pool, withSNS(sns, false, nil))
	event := func(folder string) string {
		return string(s3Event("fleet-uploads", "tenants/t1/db1/c1/"+folder+"/_SUCCESS", "ObjectCreated:Put"))
	}
	post := func(body []byte) (int, map[string]any) {
		t.Helper()
		return f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", body, nil)
	}
	status, out := post(sns.message(t, s3events.SNSNotification, testTopic, event("attacker"), "2", func(m *s3events.SNSMessage) {
		m.SigningCertURL = "https://sns.us-east-1.amazonaws.com/attacker.pem"
	}))
	require.Equal(t, http.StatusUnauthorized, status, out)
	require.Contains(t, out["error"], "certificate is not SNS's")
	status, out = post(sns.message(t, s3events.SNSNotification, testTopic, event("s3-host"), "2", func(m *s3events.SNSMessage) {
		m.SigningCertURL = "https://sns.s3.amazonaws.com/SimpleNotificationService-0123abcd.pem"
	}))
	require.Equal(t, http.StatusUnauthorized, status, out)
	require.Contains(t, out["error"], "not https on an Amazon SNS host")
	require.Equal(t, int64(1), sns.fetches.Load(), "only the attacker's certificate was fetched")

	for i, certURL := range []string{testCertURL, strings.Replace(testCertURL, "sns.us-east-1", "SNS.US-EAST-1", 1), testCertURL + "#frag"} {
		status, out := post(sns.message(t, s3events.SNSNotification, testTopic, event(fmt.Sprintf("ok-%d", i)), "2", func(m *s3events.SNSMessage) { m.SigningCertURL = certURL }))
		if strings.Contains(certURL, "#") {
			require.Equal(t, http.StatusUnauthorized, status, "a fragment is refused, not a cache miss: %v", out)
			continue
		}
		require.Equal(t, http.StatusAccepted, status, "%s: %v", certURL, out)
	}
	require.Equal(t, int64(2), sns.fetches.Load(), "one URL, however spelt, is fetched once")
	require.Equal(t, 2, count(t, pool))
}

// TestSNSCertificateFetchesAreLimited: certificate fetches that bring a
// certificate of SNS are rate limited (a burst of snsCertFetchBurst, then
// snsCertFetchesPerSecond), answered 503 with Retry-After beyond it so
// that SNS retries, and requests for one URL not yet cached share a single
// fetch.
func TestSNSCertificateFetchesAreLimited(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	sns := newFakeSNS(t)
	sns.gate = make(chan struct{})
	f := newServer(t, pool, withSNS(sns, false, nil))
	event := func(folder string) string {
		return string(s3Event("fleet-uploads", "tenants/t1/db1/c1/"+folder+"/_SUCCESS", "ObjectCreated:Put"))
	}

	// Eight deliveries at once, one certificate not yet cached: one fetch.
	const concurrent = 8
	var wg sync.WaitGroup
	statuses := make([]int, concurrent)
	for i := range concurrent {
		body := sns.message(t, s3events.SNSNotification, testTopic, event(fmt.Sprintf("c%d", i)), "2", nil)
		wg.Go(func() { statuses[i], _ = f.post(t, "/v1/events/s3", "text/plain", body, nil) })
	}
	require.Eventually(t, func() bool { return sns.fetches.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(200 * time.Millisecond) // let the other seven reach the fetch in flight
	close(sns.gate)
	wg.Wait()
	for i, status := range statuses {
		require.Equal(t, http.StatusAccepted, status, "delivery %d", i)
	}
	require.Equal(t, int64(1), sns.fetches.Load(), "concurrent requests for one URL share one fetch")

	// Twelve certificate URLs in a row, none cached, each serving a
	// certificate of SNS: the burst is fetched, the rest refused 503 with
	// Retry-After.
	var limited int
	for i := range 12 {
		req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/events/s3", bytes.NewReader(sns.message(t, s3events.SNSNotification, testTopic, event(fmt.Sprintf("m%d", i)), "2", func(m *s3events.SNSMessage) {
			m.SigningCertURL = fmt.Sprintf("https://sns.us-east-1.amazonaws.com/SimpleNotificationService-%d.pem", i)
		})))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "text/plain")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			limited++
			require.Equal(t, "1", resp.Header.Get("Retry-After"))
		} else {
			require.Equal(t, http.StatusAccepted, resp.StatusCode)
		}
	}
	fetched := sns.fetches.Load() - 1
	t.Logf("12 uncached certificate URLs in a row: %d fetched, %d refused 503", fetched, limited)
	require.LessOrEqual(t, fetched, int64(snsCertFetchBurst+2), "at most the burst and what the rate refilled meanwhile")
	require.Positive(t, limited)
}

// TestSNSForgedDeliveriesCannotSpendTheCertificateBudget replays the
// fifth audit's finding: 100 forged deliveries naming the accepted topic,
// each with a certificate URL of the topic's SNS host that serves no
// certificate (404), spent the topic's budget of certificate fetches, and
// the genuine delivery that followed, whose certificate was not cached
// yet, was answered 503. Fetches that bring no certificate of SNS spend
// nothing now: every forged delivery is refused 401 and both genuine
// deliveries, one sent during the flood and one after it, are imported.
// And, forged or not, at most snsCertFetchesInFlight fetches of a topic
// are in flight at once.
func TestSNSForgedDeliveriesCannotSpendTheCertificateBudget(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	sns := newFakeSNS(t)
	f := newServer(t, pool, withSNS(sns, false, nil))
	event := func(folder string) string {
		return string(s3Event("fleet-uploads", "tenants/t1/db1/c1/"+folder+"/_SUCCESS", "ObjectCreated:Put"))
	}
	post := func(body []byte) int {
		req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/events/s3", bytes.NewReader(body))
		if err != nil {
			return 0
		}
		req.Header.Set("Content-Type", "text/plain")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const forgedN, senders = 100, 8
	var seq atomic.Int64
	statuses := make(chan int, forgedN)
	var flood sync.WaitGroup
	for range senders {
		flood.Go(func() {
			for {
				n := seq.Add(1)
				if n > forgedN {
					return
				}
				statuses <- post(sns.message(t, s3events.SNSNotification, testTopic, event(fmt.Sprintf("forged-%d", n)), "", func(m *s3events.SNSMessage) {
					m.SignatureVersion, m.Signature = "2", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 256))
					m.SigningCertURL = fmt.Sprintf("https://sns.us-east-1.amazonaws.com/missing-%d.pem", n)
				}))
			}
		})
	}
	require.Eventually(t, func() bool { return sns.fetches.Load() >= forgedN/2 }, 60*time.Second, 5*time.Millisecond)
	during, out := f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", sns.message(t, s3events.SNSNotification, testTopic, event("genuine-during"), "2", func(m *s3events.SNSMessage) {
		m.SigningCertURL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-during.pem"
	}), nil)
	require.Equal(t, http.StatusAccepted, during, "the genuine delivery during the flood: %v", out)
	flood.Wait()
	close(statuses)
	refused := 0
	for status := range statuses {
		require.Equal(t, http.StatusUnauthorized, status, "a forged delivery is refused, not deferred")
		refused++
	}
	require.Equal(t, forgedN, refused)
	after, out := f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", sns.message(t, s3events.SNSNotification, testTopic, event("genuine-after"), "2", nil), nil)
	require.Equal(t, http.StatusAccepted, after, "the genuine delivery that follows the flood: %v", out)
	require.Equal(t, 2, count(t, pool), "only the genuine deliveries were imported")
	require.Equal(t, int64(forgedN+2), sns.fetches.Load(), "each URL fetched once")

	// At most snsCertFetchesInFlight fetches of one topic at once.
	slow := newFakeSNS(t)
	slow.gate = make(chan struct{})
	g := newServer(t, pool, withSNS(slow, false, nil))
	var held sync.WaitGroup
	for i := range 2 * snsCertFetchesInFlight {
		body := slow.message(t, s3events.SNSNotification, testTopic, event(fmt.Sprintf("held-%d", i)), "2", func(m *s3events.SNSMessage) {
			m.SigningCertURL = fmt.Sprintf("https://sns.us-east-1.amazonaws.com/missing-held-%d.pem", i)
		})
		held.Go(func() { _, _ = g.post(t, "/v1/events/s3", "text/plain", body, nil) })
	}
	require.Eventually(t, func() bool { return slow.fetches.Load() == snsCertFetchesInFlight }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, int64(snsCertFetchesInFlight), slow.fetches.Load(), "the others wait for a turn")
	close(slow.gate)
	held.Wait()
	require.Equal(t, int64(2*snsCertFetchesInFlight), slow.fetches.Load(), "each had its turn")
}

// TestSNSCertificateOutageIsRetriedNotRefused: a signing certificate that
// cannot be fetched for now (the host answers 500, or the connection is
// cut) used to answer 401, after which SNS drops the message for good. It
// is 503 with Retry-After now, nothing is claimed or imported, and SNS's
// redelivery of the same message imports it once the host answers.
func TestSNSCertificateOutageIsRetriedNotRefused(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	sns := newFakeSNS(t)
	f := newServer(t, pool, withSNS(sns, false, nil))
	for k, failure := range []string{"500", "cut"} {
		sns.fail.Store(failure)
		msg := sns.message(t, s3events.SNSNotification, testTopic, string(s3Event("fleet-uploads", "tenants/t1/db1/c1/outage-"+failure+"/_SUCCESS", "ObjectCreated:Put")), "2",
			func(m *s3events.SNSMessage) {
				m.SigningCertURL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-" + failure + ".pem"
			})
		status, out := f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", msg, nil)
		require.Equal(t, http.StatusServiceUnavailable, status, "%s: %v", failure, out)
		require.Contains(t, out["error"], "retry later", failure)
		require.Equal(t, k, count(t, pool), "%s: nothing imported", failure)
		sns.fail.Store("")
		status, out = f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", msg, nil)
		require.Equal(t, http.StatusAccepted, status, "%s: the redelivery is imported: %v", failure, out)
	}
	require.Equal(t, 2, count(t, pool))
}

// TestSNSCertificateFloodCannotStarveAnAcceptedTopic: certificate fetches
// had one budget for every request, so an unauthenticated flood of forged
// deliveries naming uncached certificates made a genuine delivery whose
// certificate was not cached yet answer 503. Each accepted topic now has a
// budget and fetches in flight of its own, and a certificate is fetched
// only from the SNS host of the topic's region: a flood naming a topic
// that is not accepted, or an accepted topic with another region's host,
// fetches nothing; one naming another accepted topic takes only that
// topic's turns. During such a flood, a genuine delivery of testTopic with
// an uncached certificate is imported.
func TestSNSCertificateFloodCannotStarveAnAcceptedTopic(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	sns := newFakeSNS(t)
	f := newServer(t, pool, withSNS(sns, false, nil))
	event := func(folder string) string {
		return string(s3Event("fleet-uploads", "tenants/t1/db1/c1/"+folder+"/_SUCCESS", "ObjectCreated:Put"))
	}
	var seq atomic.Int64
	forged := func(topic, certURL string) []byte {
		n := seq.Add(1)
		return sns.message(t, s3events.SNSNotification, topic, event(fmt.Sprintf("forged-%d", n)), "", func(m *s3events.SNSMessage) {
			m.SignatureVersion, m.Signature = "2", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 256))
			m.SigningCertURL = fmt.Sprintf(certURL, n)
		})
	}
	post := func(body []byte) int {
		req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/events/s3", bytes.NewReader(body))
		if err != nil {
			return 0
		}
		req.Header.Set("Content-Type", "text/plain")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	// Topics that are not accepted, and an accepted topic naming another
	// region's SNS host: refused before anything is fetched.
	for range 10 {
		require.Equal(t, http.StatusUnauthorized, post(forged(otherTopic, "https://sns.us-east-1.amazonaws.com/missing-%d.pem")))
		require.Equal(t, http.StatusUnauthorized, post(forged(testTopic, "https://sns.eu-west-1.amazonaws.com/missing-%d.pem")))
	}
	require.Zero(t, sns.fetches.Load(), "nothing was fetched for them")

	// A flood naming the other accepted topic, each with a new certificate
	// URL, until the genuine delivery is answered.
	stop := make(chan struct{})
	var unexpected atomic.Int64
	var flood sync.WaitGroup
	for range 4 {
		flood.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch post(forged(euTopic, "https://sns.eu-west-1.amazonaws.com/missing-%d.pem")) {
				case http.StatusServiceUnavailable, http.StatusUnauthorized:
				default:
					unexpected.Add(1)
				}
			}
		})
	}
	require.Eventually(t, func() bool { return sns.fetches.Load() >= 40 }, 60*time.Second, 5*time.Millisecond, "the flood is under way")
	status, out := f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", sns.message(t, s3events.SNSNotification, testTopic, event("genuine"), "2", nil), nil)
	close(stop)
	flood.Wait()
	require.Equal(t, http.StatusAccepted, status, "the genuine delivery is not starved by the flood: %v", out)
	require.Zero(t, unexpected.Load(), "every forged delivery was refused (401) or deferred (503)")
	require.Equal(t, 1, count(t, pool), "only the genuine delivery was imported")
}

// TestSNSTopicARNsNameTheirRegion: an accepted topic is an SNS topic ARN
// whose region is an AWS region, since its certificates are fetched only
// from that region's SNS host.
func TestSNSTopicARNsNameTheirRegion(t *testing.T) {
	t.Parallel()
	for arn, region := range map[string]string{
		testTopic: "us-east-1", "arn:aws-cn:sns:cn-north-1:123456789012:uploads": "cn-north-1",
		"arn:aws-us-gov:sns:us-gov-west-1:123456789012:uploads": "us-gov-west-1", "arn:aws:sns:eu-west-1:123456789012:uploads.fifo": "eu-west-1",
	} {
		v, err := newSNSVerifier(SNSConfig{TopicARNs: []string{arn}})
		require.NoError(t, err, arn)
		require.Equal(t, region, v.topics[arn].region, arn)
	}
	for _, arn := range []string{"fleet-uploads", "arn:aws:sns:us-east-1:123456789012", "arn:aws:s3:us-east-1:123456789012:uploads",
		"arn:aws:sns:nowhere:123456789012:uploads", "arn:aws:sns:us-east-1:1234:uploads", "arn:aws:sns:us-east-1:123456789012:up/loads"} {
		_, err := newSNSVerifier(SNSConfig{TopicARNs: []string{arn}})
		require.ErrorContains(t, err, "not an SNS topic ARN", arn)
	}
}
