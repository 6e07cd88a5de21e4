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

	"github.com/fleet/ingest/internal/pgtest"
	"github.com/fleet/ingest/internal/testproc"
)

// fakeSNS stands in for the Amazon SNS hosts: a TLS server whose
// certificate, for sns.*.amazonaws.com names, is issued by a CA made here;
// it serves a signing certificate issued by the same CA and records
// subscription confirmations. Its client trusts only that CA and dials the
// server whatever the host — except sns.ap-south-1.amazonaws.com, which
// leads to a server with a certificate nobody trusts. It does not emulate
// SNS delivery policies or certificate rotation.
type fakeSNS struct {
	signKey  *rsa.PrivateKey
	client   *http.Client
	fetches  atomic.Int64
	mu       sync.Mutex
	confirms []url.Values
}

const (
	testTopic   = "arn:aws:sns:us-east-1:123456789012:fleet-uploads"
	otherTopic  = "arn:aws:sns:us-east-1:999999999999:someone-else"
	testCertURL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0123abcd.pem"
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

	f := &fakeSNS{signKey: signKey}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, ".pem"):
			f.fetches.Add(1)
			_, _ = w.Write(signPEM)
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
func (f *fakeSNS) message(t *testing.T, typ, topic, body, version string, mod func(*snsMessage)) []byte {
	t.Helper()
	m := snsMessage{
		Type: typ, MessageID: fmt.Sprintf("m-%d", time.Now().UnixNano()), TopicArn: topic, Message: body,
		Timestamp: time.Now().UTC().Format("2006-01-02T15:04:05.000Z"), SignatureVersion: version, SigningCertURL: testCertURL,
	}
	if typ != snsNotification {
		m.Token = "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f7"
		m.SubscribeURL = "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=" + url.QueryEscape(topic) + "&Token=" + m.Token
	}
	if mod != nil {
		mod(&m)
	}
	if version != "" {
		text, err := m.stringToSign()
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
	if typ != snsNotification {
		out["Token"], out["SubscribeURL"] = m.Token, m.SubscribeURL
	}
	b, err := json.Marshal(out)
	require.NoError(t, err)
	return b
}

func withSNS(f *fakeSNS, autoConfirm bool, logs *testproc.SyncBuffer) func(*Config) {
	return func(c *Config) {
		c.SNS = &SNSConfig{TopicARNs: []string{testTopic}, AutoConfirm: autoConfirm, HTTPClient: f.client}
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
	v1 := sns.message(t, snsNotification, testTopic, event("v1"), "1", nil)
	status, out := post(v1)
	require.Equal(t, http.StatusAccepted, status, "SignatureVersion 1: %v", out)
	status, out = post(sns.message(t, snsNotification, testTopic, event("v2"), "2", func(m *snsMessage) { m.Subject = &subject }))
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
		"tampered message": {tamper(sns.message(t, snsNotification, testTopic, event("x1"), "2", nil)), "bad signature"},
		"subject added after signing": {func() []byte {
			var m map[string]any
			require.NoError(t, json.Unmarshal(sns.message(t, snsNotification, testTopic, event("x2"), "1", nil), &m))
			m["Subject"] = "added"
			b, _ := json.Marshal(m)
			return b
		}(), "bad signature"},
		"topic not accepted":      {sns.message(t, snsNotification, otherTopic, event("x3"), "2", nil), "is not accepted"},
		"unknown version":         {sns.message(t, snsNotification, testTopic, event("x4"), "", func(m *snsMessage) { m.SignatureVersion, m.Signature = "3", "AAAA" }), "unsupported SignatureVersion"},
		"too old":                 {sns.message(t, snsNotification, testTopic, event("x5"), "2", func(m *snsMessage) { m.Timestamp = time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339) }), "expired"},
		"certificate over http":   {sns.message(t, snsNotification, testTopic, event("x6"), "2", func(m *snsMessage) { m.SigningCertURL = strings.Replace(testCertURL, "https", "http", 1) }), "not https on an Amazon SNS host"},
		"certificate elsewhere":   {sns.message(t, snsNotification, testTopic, event("x7"), "2", func(m *snsMessage) { m.SigningCertURL = "https://sns.us-east-1.amazonaws.com.evil.example/x.pem" }), "not https on an Amazon SNS host"},
		"certificate lookalike":   {sns.message(t, snsNotification, testTopic, event("x8"), "2", func(m *snsMessage) { m.SigningCertURL = "https://evil.example/sns.us-east-1.amazonaws.com/x.pem" }), "not https on an Amazon SNS host"},
		"certificate with a port": {sns.message(t, snsNotification, testTopic, event("x9"), "2", func(m *snsMessage) { m.SigningCertURL = "https://sns.us-east-1.amazonaws.com:8443/x.pem" }), "not https on an Amazon SNS host"},
		"certificate not trusted": {sns.message(t, snsNotification, testTopic, event("xa"), "2", func(m *snsMessage) { m.SigningCertURL = "https://sns.ap-south-1.amazonaws.com/x.pem" }), "certificate"},
		"certificate not a .pem":  {sns.message(t, snsNotification, testTopic, event("xb"), "2", func(m *snsMessage) { m.SigningCertURL = "https://sns.us-east-1.amazonaws.com/?Action=Publish" }), "not a certificate URL"},
		"no signature, no token":  {sns.message(t, snsNotification, testTopic, event("xc"), "", nil), "missing credentials"},
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
	confirmation := sns.message(t, snsSubscriptionConfirmation, testTopic, "You have chosen to subscribe to the topic "+testTopic, "2", nil)

	status, out := post(auto, confirmation)
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, "confirmed", out["outcome"])
	require.Len(t, sns.confirmations(), 1)
	require.Equal(t, testTopic, sns.confirmations()[0].Get("TopicArn"))
	require.Contains(t, logs.String(), `"msg":"SNS subscription confirmed"`)
	require.Contains(t, logs.String(), `"topic_arn":"`+testTopic+`"`)
	require.NotContains(t, logs.String(), "2336412f37fb", "the subscription token is not logged")
	require.Equal(t, float64(1), snsCounter(t, auto, "confirmed"))

	// Another topic: logged and counted, never confirmed.
	status, out = post(auto, sns.message(t, snsSubscriptionConfirmation, otherTopic, "subscribe", "1", nil))
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, "ignored", out["outcome"])
	require.Contains(t, logs.String(), `"topic_arn":"`+otherTopic+`"`)
	require.Equal(t, float64(1), snsCounter(t, auto, "unconfirmed"))
	// Without auto-confirm: the same.
	status, _ = post(manual, confirmation)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, float64(1), snsCounter(t, manual, "unconfirmed"))
	require.Len(t, sns.confirmations(), 1)

	// A SubscribeURL off the SNS hosts is never fetched, even signed.
	status, _ = post(auto, sns.message(t, snsSubscriptionConfirmation, testTopic, "subscribe", "2", func(m *snsMessage) {
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

func TestSNSStringToSign(t *testing.T) {
	t.Parallel()
	subject := "My subject"
	n := snsMessage{Type: snsNotification, Message: "My Test Message", MessageID: "4d4dc071-ddbf-465d-bba8-08f81c89da64",
		Subject: &subject, Timestamp: "2019-01-31T04:37:04.321Z", TopicArn: "arn:aws:sns:us-east-2:123456789012:s4-MySNSTopic-1G1WEFCOXTC0P",
		Token: "ignored", SubscribeURL: "ignored"}
	text, err := n.stringToSign()
	require.NoError(t, err)
	require.Equal(t, "Message\nMy Test Message\nMessageId\n4d4dc071-ddbf-465d-bba8-08f81c89da64\nSubject\nMy subject\n"+
		"Timestamp\n2019-01-31T04:37:04.321Z\nTopicArn\narn:aws:sns:us-east-2:123456789012:s4-MySNSTopic-1G1WEFCOXTC0P\nType\nNotification\n", text)
	c := snsMessage{Type: snsSubscriptionConfirmation, Message: "My Test Message", MessageID: "3d891288-136d-417f-bc05-901c108273ee",
		SubscribeURL: "https://sns.us-east-2.amazonaws.com/?Action=ConfirmSubscription&Token=233", Timestamp: "2019-01-31T19:25:13.719Z",
		Token: "233", TopicArn: "arn:aws:sns:us-east-2:123456789012:s4-MySNSTopic-1G1WEFCOXTC0P", Subject: &subject}
	text, err = c.stringToSign()
	require.NoError(t, err)
	require.Equal(t, "Message\nMy Test Message\nMessageId\n3d891288-136d-417f-bc05-901c108273ee\n"+
		"SubscribeURL\nhttps://sns.us-east-2.amazonaws.com/?Action=ConfirmSubscription&Token=233\nTimestamp\n2019-01-31T19:25:13.719Z\n"+
		"Token\n233\nTopicArn\narn:aws:sns:us-east-2:123456789012:s4-MySNSTopic-1G1WEFCOXTC0P\nType\nSubscriptionConfirmation\n", text,
		"confirmations sign SubscribeURL and Token, never Subject")
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
	captured := sns.message(t, snsNotification, testTopic, string(s3Event("fleet-uploads", "tenants/t1/db1/c1/respell/_SUCCESS", "ObjectCreated:Put")), "2", nil)
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
