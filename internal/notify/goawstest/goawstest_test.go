package goawstest

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/testdeps"
)

// envelope is what SNS posts to an http(s) subscription.
type envelope struct {
	Type, MessageId, Token, TopicArn, Subject, Message, Timestamp string
	SignatureVersion, Signature, SigningCertURL, SubscribeURL     string
	MessageAttributes                                             map[string]struct{ Type, Value string }

	messageType string // the x-amz-sns-message-type header
	raw         []byte
}

// endpoint is an http subscription endpoint recording what it receives.
func endpoint(t *testing.T, status int) (*httptest.Server, chan envelope) {
	got := make(chan envelope, 20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var e envelope
		_ = json.Unmarshal(raw, &e)
		e.messageType, e.raw = r.Header.Get("x-amz-sns-message-type"), raw
		got <- e
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

// next returns what the endpoint received already: goaws delivers inside
// the call that caused the delivery.
func next(t *testing.T, got chan envelope) envelope {
	t.Helper()
	select {
	case e := <-got:
		return e
	default:
		t.Fatal("nothing delivered by the time the call returned")
		return envelope{}
	}
}

func str(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// TestGoawsDelivers checks what the package documentation says goaws
// emulates: the topic ARN, the subscription confirmation, synchronous
// delivery with the subject and String attributes, and the signature.
func TestGoawsDelivers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := Start(t)
	arn := s.CreateTopic(t, "fleet-acme")
	require.Equal(t, "arn:aws:sns:"+Region+":"+AccountID+":fleet-acme", arn)
	srv, got := endpoint(t, http.StatusOK)
	subARN := s.Subscribe(t, arn, srv.URL+"/sns")

	conf := next(t, got)
	require.Equal(t, "SubscriptionConfirmation", conf.Type)
	require.Equal(t, "SubscriptionConfirmation", conf.messageType)
	require.Equal(t, arn, conf.TopicArn)
	resp, err := http.Get(conf.SubscribeURL)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), subARN)
	verifySignature(t, conf)

	_, err = s.Client().Publish(ctx, &sns.PublishInput{
		TopicArn: aws.String(arn), Message: aws.String(`{"a":1}`), Subject: aws.String("fleet batch 1 failed"),
		MessageAttributes: map[string]types.MessageAttributeValue{"outcome": str("failed"), "tenant_id": str("Fløde AS")},
	})
	require.NoError(t, err)
	n := next(t, got)
	require.Equal(t, "Notification", n.Type)
	require.Equal(t, "Notification", n.messageType)
	require.Equal(t, `{"a":1}`, n.Message)
	require.Equal(t, "fleet batch 1 failed", n.Subject)
	require.Equal(t, arn, n.TopicArn)
	require.Len(t, n.MessageAttributes, 2)
	require.Equal(t, "String", n.MessageAttributes["outcome"].Type)
	require.Equal(t, "failed", n.MessageAttributes["outcome"].Value)
	require.Equal(t, "Fløde AS", n.MessageAttributes["tenant_id"].Value)
	verifySignature(t, n)

	_, err = s.Client().Publish(ctx, &sns.PublishInput{TopicArn: aws.String(arn + "-missing"), Message: aws.String("x")})
	require.ErrorContains(t, err, "NonExistentTopic", "a missing topic is an API error")
}

// verifySignature checks an envelope's SignatureVersion 1 signature
// (SHA1withRSA over SNS's canonical string) with the key of the
// certificate at SigningCertURL. Only the signature: the certificate is
// self-signed and expired five seconds after goaws started.
func verifySignature(t *testing.T, e envelope) {
	t.Helper()
	require.Equal(t, "1", e.SignatureVersion)
	resp, err := http.Get(e.SigningCertURL)
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	block, _ := pem.Decode(raw)
	require.NotNil(t, block, "no PEM at %s", e.SigningCertURL)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	var canonical string
	switch {
	case e.Type == "Notification" && e.Subject != "":
		canonical = fmt.Sprintf("Message\n%s\nMessageId\n%s\nSubject\n%s\nTimestamp\n%s\nTopicArn\n%s\nType\n%s\n", e.Message, e.MessageId, e.Subject, e.Timestamp, e.TopicArn, e.Type)
	case e.Type == "Notification":
		canonical = fmt.Sprintf("Message\n%s\nMessageId\n%s\nTimestamp\n%s\nTopicArn\n%s\nType\n%s\n", e.Message, e.MessageId, e.Timestamp, e.TopicArn, e.Type)
	default:
		canonical = fmt.Sprintf("Message\n%s\nMessageId\n%s\nSubscribeURL\n%s\nTimestamp\n%s\nToken\n%s\nTopicArn\n%s\nType\n%s\n", e.Message, e.MessageId, e.SubscribeURL, e.Timestamp, e.Token, e.TopicArn, e.Type)
	}
	sig, err := base64.StdEncoding.DecodeString(e.Signature)
	require.NoError(t, err)
	sum := sha1.Sum([]byte(canonical))
	require.NoError(t, rsa.VerifyPKCS1v15(cert.PublicKey.(*rsa.PublicKey), crypto.SHA1, sum[:], sig))
}

// TestGoawsDoesNotEmulate pins what the package documentation says goaws
// does not do, so that a new version that does is noticed (and the
// documentation, and the tests that work around it, updated).
func TestGoawsDoesNotEmulate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := Start(t)
	c := s.Client()
	arn := s.CreateTopic(t, "fleet-acme.fifo")
	srv, got := endpoint(t, http.StatusInternalServerError)
	subARN := s.Subscribe(t, arn, srv.URL)
	require.Equal(t, "SubscriptionConfirmation", next(t, got).Type)

	// Never confirmed, answering 500: it still gets each publish, once;
	// Publish succeeds; FIFO deduplication does not drop the repeat.
	fifo := &sns.PublishInput{TopicArn: aws.String(arn), Message: aws.String(`{"b":2}`), MessageGroupId: aws.String("g"), MessageDeduplicationId: aws.String("d")}
	for range 2 {
		_, err := c.Publish(ctx, fifo)
		require.NoError(t, err)
		require.Equal(t, `{"b":2}`, next(t, got).Message)
	}
	// A FIFO publish without a group is not refused.
	_, err := c.Publish(ctx, &sns.PublishInput{TopicArn: aws.String(arn), Message: aws.String("nogroup")})
	require.NoError(t, err)
	require.Equal(t, "nogroup", next(t, got).Message)
	require.Empty(t, got, "no retry of the 500")

	// Raw delivery posts the message as a JSON string.
	_, err = c.SetSubscriptionAttributes(ctx, &sns.SetSubscriptionAttributesInput{
		SubscriptionArn: aws.String(subARN), AttributeName: aws.String("RawMessageDelivery"), AttributeValue: aws.String("true"),
	})
	require.NoError(t, err)
	_, err = c.Publish(ctx, &sns.PublishInput{TopicArn: aws.String(arn), Message: aws.String(`{"c":3}`)})
	require.NoError(t, err)
	require.Equal(t, `"{\"c\":3}"`, string(next(t, got).raw))
}

// recorder is a testing.TB whose Fatalf and Skipf are recorded, not acted on.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                      {}
func (r *recorder) Fatalf(f string, args ...any) { r.fatal = fmt.Sprintf(f, args...) }
func (r *recorder) Skipf(f string, args ...any)  { r.skip = fmt.Sprintf(f, args...) }

// TestStartFailsOrSkips: a missing binary fails the test, naming the
// command that installs it; only under -short is it skipped. A binary that
// does not start fails it under -short too. CI no longer matters.
func TestStartFailsOrSkips(t *testing.T) {
	broken := filepath.Join(t.TempDir(), "goaws")
	require.NoError(t, os.WriteFile(broken, []byte("#!/bin/sh\necho cannot bind >&2\nexit 1\n"), 0o755))
	defer func(short func() bool) { testdeps.Short = short }(testdeps.Short)
	for _, tc := range []struct {
		name, bin, ci string
		short         bool
		fatal, skip   string
	}{
		{"unset", "", "", false, "sudo make test-deps", ""},
		{"unset in CI", "", "true", false, "GOAWS_BIN is not set", ""},
		{"unset under -short", "", "", true, "", "GOAWS_BIN is not set"},
		{"missing", filepath.Join(t.TempDir(), "nope"), "", false, "no such file", ""},
		{"missing under -short", filepath.Join(t.TempDir(), "nope"), "", true, "", "no such file"},
		{"not executable", t.TempDir(), "", false, "not an executable file", ""},
		{"exits at start", broken, "", false, "cannot bind", ""},
		{"exits at start under -short", broken, "", true, "cannot bind", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvBin, tc.bin)
			t.Setenv("CI", tc.ci)
			testdeps.Short = func() bool { return tc.short }
			r := &recorder{TB: t}
			require.Nil(t, Start(r))
			if tc.fatal != "" {
				require.Contains(t, r.fatal, tc.fatal)
				require.Empty(t, r.skip)
			} else {
				require.Contains(t, r.skip, tc.skip)
				require.Empty(t, r.fatal)
			}
		})
	}
}
