package notify

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	secretA = "s3cr3t-acme-0123456789"
	arnA    = "arn:aws:sns:eu-west-1:123456789012:fleet-acme"
)

const goodFile = `{"tenants": {
  "acme": [
    {"name": "ops-hook", "kind": "webhook", "url": "https://hooks.acme.example/fleet", "secret": "` + secretA + `"},
    {"name": "alerts", "kind": "sns", "topic_arn": "` + arnA + `"},
    {"name": "dev_1", "kind": "webhook", "url": "http://127.0.0.1:8080/hook?token=abc", "secret": "` + secretA + `"}
  ],
  "beta co": [
    {"name": "fifo", "kind": "sns", "topic_arn": "arn:aws-us-gov:sns:us-gov-west-1:000000000000:beta.fifo"}
  ],
  "quiet": []
}}`

func TestParseGoodFile(t *testing.T) {
	c, err := Parse([]byte(goodFile))
	require.NoError(t, err)
	tenants, dests := c.Counts()
	require.Equal(t, 3, tenants)
	require.Equal(t, 4, dests)

	acme := c.Destinations("acme")
	require.Equal(t, []Destination{
		{Name: "ops-hook", Kind: KindWebhook, URL: "https://hooks.acme.example/fleet", Secret: secretA},
		{Name: "alerts", Kind: KindSNS, TopicARN: arnA},
		{Name: "dev_1", Kind: KindWebhook, URL: "http://127.0.0.1:8080/hook?token=abc", Secret: secretA},
	}, acme, "file order, every field")
	acme[0].Name = "changed"
	require.Equal(t, "ops-hook", c.Destinations("acme")[0].Name, "Destinations returns a copy")

	d, ok := c.Destination("beta co", "fifo")
	require.True(t, ok)
	require.Equal(t, KindSNS, d.Kind)
	_, ok = c.Destination("acme", "fifo")
	require.False(t, ok, "names are per tenant")
	require.Empty(t, c.Destinations("quiet"))
	require.Empty(t, c.Destinations("nobody"))

	var nilConfig *Config
	require.Empty(t, nilConfig.Destinations("acme"))
}

// TestParseRefuses: each invalid file is refused with an error naming the
// tenant, the destination and the field, and no error carries a secret or
// a URL's userinfo or query.
func TestParseRefuses(t *testing.T) {
	hook := func(fields string) string {
		return `{"tenants": {"acme": [{"name": "ok", "kind": "sns", "topic_arn": "` + arnA + `"}, ` + fields + `]}}`
	}
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"syntax", `{"tenants": {"acme": [{"name": "x", "secret": "` + secretA + `"`, []string{"empty or truncated"}},
		{"syntax2", `{"tenants": {"acme": [{"name": "x" "secret": "` + secretA + `"}]}}`, []string{"not valid JSON", "byte"}},
		{"empty", ``, []string{"empty"}},
		{"no tenants", `{}`, []string{`no "tenants"`}},
		{"unknown top field", `{"tenants": {}, "tenant": {}}`, []string{`unknown field "tenant"`}},
		{"unknown destination field", hook(`{"name": "h", "kind": "webhook", "url": "https://h.example/", "secret": "` + secretA + `", "secrets": "x"}`), []string{`tenant "acme"`, `unknown field "secrets"`}},
		{"trailing data", `{"tenants": {}} {}`, []string{"after the top-level object"}},
		{"tenants not an object", `{"tenants": []}`, []string{`"tenants" must be an object`}},
		{"wrong type", hook(`{"name": "h", "kind": "webhook", "url": "https://h.example/", "secret": 12345678901234567}`), []string{`tenant "acme": secret: a JSON number where a string belongs`}},
		{"duplicate tenant", `{"tenants": {"acme": [], "acme": []}}`, []string{`tenant "acme" appears twice`}},
		{"bad tenant", `{"tenants": {" acme": []}}`, []string{`tenant " acme"`, "tenant_id"}},
		{"empty name", hook(`{"name": "", "kind": "sns", "topic_arn": "` + arnA + `"}`), []string{`tenant "acme"`, "destination 1", "name: must not be empty"}},
		{"bad name", hook(`{"name": "Ops Hook", "kind": "sns", "topic_arn": "` + arnA + `"}`), []string{"destination 1:", "name: may hold only"}},
		{"long name", hook(`{"name": "` + strings.Repeat("a", 65) + `", "kind": "sns", "topic_arn": "` + arnA + `"}`), []string{"destination 1:", "at most 64"}},
		{"duplicate name", hook(`{"name": "ok", "kind": "sns", "topic_arn": "` + arnA + `"}`), []string{`destination 1 ("ok")`, "name: the same name as destination 0"}},
		{"no kind", hook(`{"name": "h", "url": "https://h.example/"}`), []string{`destination 1 ("h")`, "kind: must not be empty"}},
		{"bad kind", hook(`{"name": "h", "kind": "email"}`), []string{`("h")`, `kind: must be "webhook" or "sns"`}},
		{"http webhook", hook(`{"name": "h", "kind": "webhook", "url": "http://user:pw@hooks.acme.example/x?token=tok123", "secret": "` + secretA + `"}`), []string{`("h")`, "url: must be https"}},
		{"ftp webhook", hook(`{"name": "h", "kind": "webhook", "url": "ftp://localhost/x", "secret": "` + secretA + `"}`), []string{"url: must be https"}},
		{"relative url", hook(`{"name": "h", "kind": "webhook", "url": "/hook?token=tok123", "secret": "` + secretA + `"}`), []string{"url: must be an absolute URL"}},
		{"unparsable url", hook(`{"name": "h", "kind": "webhook", "url": "https://h.example/%zz?token=tok123", "secret": "` + secretA + `"}`), []string{"url: is not a valid URL"}},
		{"no url", hook(`{"name": "h", "kind": "webhook", "secret": "` + secretA + `"}`), []string{"url: must not be empty"}},
		{"short secret", hook(`{"name": "h", "kind": "webhook", "url": "https://h.example/", "secret": "short-secret-15"}`), []string{`("h")`, "secret: must be at least 16 bytes"}},
		{"webhook with topic", hook(`{"name": "h", "kind": "webhook", "url": "https://h.example/", "secret": "` + secretA + `", "topic_arn": "` + arnA + `"}`), []string{"topic_arn: belongs to an sns destination"}},
		{"sns with secret", hook(`{"name": "t", "kind": "sns", "topic_arn": "` + arnA + `", "secret": "` + secretA + `"}`), []string{`("t")`, "secret: belongs to a webhook"}},
		{"sns with url", hook(`{"name": "t", "kind": "sns", "topic_arn": "` + arnA + `", "url": "https://h.example/?token=tok123"}`), []string{"url: belongs to a webhook"}},
		{"sns no topic", hook(`{"name": "t", "kind": "sns"}`), []string{"topic_arn: must not be empty"}},
		{"sqs arn", hook(`{"name": "t", "kind": "sns", "topic_arn": "arn:aws:sqs:eu-west-1:123456789012:q"}`), []string{`("t")`, "topic_arn: must be arn:"}},
		{"short account", hook(`{"name": "t", "kind": "sns", "topic_arn": "arn:aws:sns:eu-west-1:12345:q"}`), []string{"topic_arn: must be arn:"}},
		{"no region", hook(`{"name": "t", "kind": "sns", "topic_arn": "arn:aws:sns::123456789012:q"}`), []string{"topic_arn: must be arn:"}},
		{"bad topic name", hook(`{"name": "t", "kind": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:a/b"}`), []string{"topic_arn: must be arn:"}},
		{"long topic name", hook(`{"name": "t", "kind": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:` + strings.Repeat("a", 257) + `"}`), []string{"topic_arn: must be arn:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.file))
			require.Error(t, err)
			require.Nil(t, c)
			msg := err.Error()
			for _, w := range tc.want {
				require.Contains(t, msg, w)
			}
			for _, leak := range []string{secretA, "short-secret-15", "tok123", "user:pw", "pw@"} {
				require.NotContains(t, msg, leak, "the error quotes a secret")
			}
		})
	}
}

func TestParseAcceptsLoopbackHTTP(t *testing.T) {
	for _, u := range []string{"http://localhost:9/x", "http://LOCALHOST/x", "http://127.0.0.1/x", "http://127.9.9.9:1/x", "http://[::1]:8080/x", "https://example.com/x"} {
		_, err := Parse([]byte(`{"tenants": {"acme": [{"name": "h", "kind": "webhook", "url": "` + u + `", "secret": "` + secretA + `"}]}}`))
		require.NoError(t, err, u)
	}
	for _, u := range []string{"http://128.0.0.1/x", "http://localhost.example.com/x", "http://[::2]/x", "http://10.0.0.1/x"} {
		_, err := Parse([]byte(`{"tenants": {"acme": [{"name": "h", "kind": "webhook", "url": "` + u + `", "secret": "` + secretA + `"}]}}`))
		require.ErrorContains(t, err, "must be https", u)
	}
}

func TestValidTopicARN(t *testing.T) {
	for _, a := range []string{arnA, "arn:aws-cn:sns:cn-north-1:123456789012:t_1", "arn:aws:sns:us-east-1:123456789012:orders.fifo", "arn:aws:sns:ap-southeast-2:123456789012:" + strings.Repeat("x", 256)} {
		require.True(t, ValidTopicARN(a), a)
	}
	for _, a := range []string{"", "arn:aws:sns:us-east-1:123456789012:", "arn:aws:sns:us-east-1:1234567890123:t", "arn:gcp:sns:us-east-1:123456789012:t",
		"arn:aws:sns:us-east-1:123456789012:t.fifo.x", "arn:aws:sns:us-east-1:123456789012:t:sub", "arn:aws:sns:useast1:123456789012:t", " " + arnA} {
		require.False(t, ValidTopicARN(a), a)
	}
}

// TestDestinationNeverPrintsItsSecret formats a destination every way a
// log line or an error could.
func TestDestinationNeverPrintsItsSecret(t *testing.T) {
	d := Destination{Name: "ops-hook", Kind: KindWebhook, URL: "https://bob:pw@hooks.acme.example/fleet?token=tok123#frag", Secret: secretA}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("sending", "destination", d)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("sending", "destination", d)
	out := fmt.Sprint(d) + fmt.Sprintf("%v %+v %#v %s %q", d, d, d, d, d) + fmt.Sprint([]Destination{d}) + logged.String()
	for _, leak := range []string{secretA, "tok123", "bob", "pw@", "frag"} {
		require.NotContains(t, out, leak)
	}
	require.Contains(t, out, "https://hooks.acme.example/fleet")
	require.Contains(t, logged.String(), `"destination":{"name":"ops-hook","kind":"webhook","target":"https://hooks.acme.example/fleet"}`)
	require.Equal(t, `webhook "ops-hook" (https://hooks.acme.example/fleet)`, d.String())
	require.Equal(t, `sns "alerts" (`+arnA+`)`, Destination{Name: "alerts", Kind: KindSNS, TopicARN: arnA}.String())
	require.Equal(t, "(invalid URL)", RedactURL("https://h.example/%zz?token=tok123"))
}

func TestFieldErrorIsAnError(t *testing.T) {
	_, err := Parse([]byte(`{"tenants": {"acme": [{"name": "h", "kind": "webhook", "url": "https://h.example/", "secret": "x"}]}}`))
	var fe *FieldError
	require.True(t, errors.As(err, &fe))
	require.Equal(t, FieldError{Tenant: "acme", Index: 0, Name: "h", Field: "secret", Problem: "must be at least 16 bytes"}, *fe)
}
