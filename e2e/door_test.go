package e2e

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// processSNS stands in for the Amazon SNS hosts for an enqueue serve
// process: a TLS server for sns.us-east-1.amazonaws.com whose certificate
// a CA made here issued (the process trusts it through SSL_CERT_FILE), an
// HTTP CONNECT proxy that leads every host there (the process uses it
// through HTTPS_PROXY), a signing certificate naming sns.amazonaws.com,
// and messages signed with SignatureVersion 2. It counts certificate
// fetches. It does not emulate SNS delivery, retries or confirmations.
type processSNS struct {
	signKey *rsa.PrivateKey
	env     []string
	fetches atomic.Int64
}

const (
	e2eTopic   = "arn:aws:sns:us-east-1:123456789012:fleet-uploads"
	e2eCertURL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-e2e.pem"
)

func newProcessSNS(t *testing.T) *processSNS {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleet e2e SNS CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
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
	tlsDER := issue(2, &x509.Certificate{Subject: pkix.Name{CommonName: "sns.us-east-1.amazonaws.com"}, DNSNames: []string{"sns.us-east-1.amazonaws.com"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, &tlsKey.PublicKey)
	signKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	signPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE",
		Bytes: issue(3, &x509.Certificate{Subject: pkix.Name{CommonName: "sns.amazonaws.com"}, KeyUsage: x509.KeyUsageDigitalSignature}, &signKey.PublicKey)})

	f := &processSNS{signKey: signKey}
	snsHost := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, ".pem") {
			http.NotFound(w, r)
			return
		}
		f.fetches.Add(1)
		_, _ = w.Write(signPEM)
	}))
	snsHost.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{tlsDER}, PrivateKey: tlsKey}}}
	snsHost.StartTLS()
	t.Cleanup(snsHost.Close)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		upstream, err := net.Dial("tcp", snsHost.Listener.Addr().String())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		// Hijack first and answer on the raw connection: a 200 written
		// through the ResponseWriter is framed as an HTTP response with a
		// body, and bytes the client sent early sit in the server's reader.
		client, buffered, err := http.NewResponseController(w).Hijack()
		if err != nil {
			upstream.Close()
			return
		}
		if _, err := client.Write([]byte("HTTP/1.1 200 Connection Established\r\n\r\n")); err != nil {
			client.Close()
			upstream.Close()
			return
		}
		go func() { _, _ = io.Copy(upstream, buffered.Reader); upstream.Close() }()
		go func() { _, _ = io.Copy(client, upstream); client.Close() }()
	}))
	t.Cleanup(proxy.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))
	f.env = []string{"SSL_CERT_FILE=" + caFile, "HTTPS_PROXY=" + proxy.URL, "https_proxy=" + proxy.URL, "NO_PROXY=", "no_proxy="}
	return f
}

// notification returns an SNS Notification of message from topic, signed
// (SignatureVersion 2) with the certificate at certURL, as SNS sends it.
func (f *processSNS) notification(t *testing.T, topic, message, certURL string) map[string]string {
	t.Helper()
	m := map[string]string{
		"Type": "Notification", "MessageId": fmt.Sprintf("e2e-%d", time.Now().UnixNano()), "TopicArn": topic, "Message": message,
		"Timestamp": time.Now().UTC().Format("2006-01-02T15:04:05.000Z"), "SignatureVersion": "2", "SigningCertURL": certURL,
		"UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=" + topic + ":x",
	}
	var text strings.Builder
	for _, k := range []string{"Message", "MessageId", "Timestamp", "TopicArn", "Type"} {
		text.WriteString(k + "\n" + m[k] + "\n")
	}
	d := sha256.Sum256([]byte(text.String()))
	sig, err := rsa.SignPKCS1v15(rand.Reader, f.signKey, crypto.SHA256, d[:])
	require.NoError(t, err)
	m["Signature"] = base64.StdEncoding.EncodeToString(sig)
	return m
}

// postSNS posts body as SNS does (text/plain, no credentials).
func postSNS(t *testing.T, base string, body []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/events/s3", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "text/plain; charset=UTF-8")
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// TestSNSImportsOnlyTheSignedMessage replays through a real enqueue serve
// the red team's differential: a validly signed SNS notification with an
// unsigned top-level "Records" (or its envelope respelt in lower case
// beside EventBridge fields) was imported from the unsigned part (202) and
// the genuine delivery then refused as "signature already used". Both are
// refused 400 now, nothing is written, and the genuine delivery imports
// the signed folder.
func TestSNSImportsOnlyTheSignedMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	sns := newProcessSNS(t)
	_, base := startServe(t, dbURL, append([]string{"ENQUEUE_AUTH_TOKEN=tok"}, sns.env...), "--sns-topic-arn", e2eTopic)

	genuine := sns.notification(t, e2eTopic, string(s3EventBody("fleet-uploads", "tenants/acme/acme_db/c1/signed/_SUCCESS")), e2eCertURL)
	withRecords := map[string]any{}
	for k, v := range genuine {
		withRecords[k] = v
	}
	withRecords["Records"] = json.RawMessage(`[{"eventSource":"aws:s3","eventName":"ObjectCreated:Put","s3":{"bucket":{"name":"fleet-uploads"},"object":{"key":"tenants/evil/evil_db/c1/unsigned/_SUCCESS"}}}]`)
	lower := map[string]any{"detail-type": "Object Created", "source": "aws.s3",
		"detail": map[string]any{"bucket": map[string]any{"name": "fleet-uploads"}, "object": map[string]any{"key": "tenants/evil/evil_db/c1/eventbridge/_SUCCESS"}}}
	for k, v := range genuine {
		lower[strings.ToLower(k)] = v
	}
	for name, body := range map[string][]byte{"unsigned Records": marshal(t, withRecords), "lower-case envelope and EventBridge fields": marshal(t, lower)} {
		status, out := postSNS(t, base, body)
		require.Equal(t, http.StatusBadRequest, status, "%s: %v", name, out)
		require.Contains(t, out["error"], "ambiguous", name)
	}
	var batches int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&batches))
	require.Zero(t, batches, "nothing was imported from an unsigned field")

	status, out := postSNS(t, base, marshal(t, genuine))
	require.Equal(t, http.StatusAccepted, status, "the genuine delivery is imported, not refused as a replay: %v", out)
	var scope string
	require.NoError(t, pool.QueryRow(ctx, `SELECT source_scope FROM ingestion_batches`).Scan(&scope))
	require.Contains(t, scope, "tenants/acme/acme_db/c1/signed")
	require.Equal(t, int64(1), sns.fetches.Load())
}

// TestSNSUnknownTopicFetchesNoCertificate: messages (a subscription
// confirmation, a notification) claiming a topic that is not accepted are
// refused before anything is fetched: an attacker cannot make enqueue
// serve fetch URLs of its choosing, even on SNS hosts. The confirmation
// used to be verified, and its certificate fetched, before its topic was
// looked at. A message of the accepted topic fetches its certificate once.
func TestSNSUnknownTopicFetchesNoCertificate(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	sns := newProcessSNS(t)
	_, base := startServe(t, dbURL, append([]string{"ENQUEUE_AUTH_TOKEN=tok"}, sns.env...), "--sns-topic-arn", e2eTopic)
	other := "arn:aws:sns:us-east-1:999999999999:attacker"

	confirmation := sns.notification(t, other, "You have chosen to subscribe", e2eCertURL)
	confirmation["Type"], confirmation["Token"] = "SubscriptionConfirmation", "tok123"
	confirmation["SubscribeURL"] = "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=" + other + "&Token=tok123"
	delete(confirmation, "UnsubscribeURL")
	for name, body := range map[string][]byte{
		"subscription confirmation": marshal(t, confirmation),
		"notification":              marshal(t, sns.notification(t, other, string(s3EventBody("fleet-uploads", "tenants/a/b/c/x/_SUCCESS")), e2eCertURL)),
	} {
		status, out := postSNS(t, base, body)
		require.Equal(t, http.StatusUnauthorized, status, "%s: %v", name, out)
		require.Contains(t, out["error"], "is not accepted", name)
	}
	require.Zero(t, sns.fetches.Load(), "no certificate was fetched for a topic that is not accepted")

	status, out := postSNS(t, base, marshal(t, sns.notification(t, e2eTopic, string(s3EventBody("fleet-uploads", "tenants/a/b/c/y/_SUCCESS")), e2eCertURL)))
	require.Equal(t, http.StatusAccepted, status, out)
	require.Equal(t, int64(1), sns.fetches.Load())
}

// TestDoorRateLimit: enqueue serve --rate-limit/--rate-burst limits each
// credential: over it, 429 with Retry-After in seconds and a JSON body
// {"outcome":"rate_limited"}, counted in ingest_http_requests_total; one
// request cannot start more folders than the burst; wrong tokens do not
// spend the budget of the right one.
func TestDoorRateLimit(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	_, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok", "RATE_LIMIT=0.01"}, "--rate-burst", "3")

	records := make([]any, 50)
	for i := range records {
		records[i] = map[string]any{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
			"s3": map[string]any{"bucket": map[string]any{"name": "fleet-uploads"}, "object": map[string]any{"key": fmt.Sprintf("tenants/t%d/db/c/x/_SUCCESS", i)}}}
	}
	status, out := postJSON(t, base+"/v1/events/s3", "tok", map[string]any{"Records": records})
	require.Equal(t, http.StatusUnprocessableEntity, status, "50 tenants' folders in one request: %v", out)
	for range 10 {
		status, _ := postJSON(t, base+"/v1/imports", "wrong", map[string]any{"folder": "s3://fleet-uploads/tenants/a/b/c/w"})
		require.Equal(t, http.StatusUnauthorized, status)
	}
	for i := range 3 {
		status, out := postJSON(t, base+"/v1/imports", "tok", map[string]any{"folder": fmt.Sprintf("s3://fleet-uploads/tenants/a/b/c/ok-%d", i)})
		require.Equal(t, http.StatusAccepted, status, "within the burst: %v", out)
	}
	req, err := newRequest(base+"/v1/imports", `{"folder":"s3://fleet-uploads/tenants/a/b/c/over"}`)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After in seconds")
	require.Positive(t, secs)
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, "rate_limited", body["outcome"])
	require.Contains(t, httpGet(t, base+"/metrics"), `ingest_http_request_outcomes_total{outcome="rate_limited",route="POST /v1/imports"} 1`)
}

// TestRiverUIRefusesFraming: every answer under /riverui/ of a real
// enqueue serve, the UI itself and its refusals, carries X-Frame-Options
// DENY, Content-Security-Policy frame-ancestors 'none' and
// X-Content-Type-Options nosniff, so no other site can frame the
// operator's authenticated pages.
func TestRiverUIRefusesFraming(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	serve, _ := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=ui-token", "ENQUEUE_OPERATOR_TOKEN=ui-operator-token"})
	base := "http://" + adminAddr(t, serve) // the River UI is on the admin listener
	for name, auth := range map[string]string{"the UI": "Bearer ui-operator-token", "no credentials": "", "the import token": "Bearer ui-token"} {
		req, err := http.NewRequest(http.MethodGet, base+"/riverui/", nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		if name == "the UI" {
			require.Equal(t, http.StatusOK, resp.StatusCode)
		}
		require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"), name)
		require.Contains(t, resp.Header.Values("Content-Security-Policy"), "frame-ancestors 'none'", name)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), name)
	}
}
