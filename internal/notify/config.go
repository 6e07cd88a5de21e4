package notify

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"strings"

	"github.com/fleet/ingest/internal/batch"
)

// Kind is how a destination is reached.
type Kind string

// The kinds of destination.
const (
	KindWebhook Kind = "webhook"
	KindSNS     Kind = "sns"
)

// Kinds are the known kinds (the kind label of the notification metrics).
var Kinds = []Kind{KindWebhook, KindSNS}

// MinSecretLen is the shortest webhook secret Parse accepts, in bytes.
const MinSecretLen = 16

// MaxNameLen is the longest destination name, in bytes.
const MaxNameLen = 64

// Destination is one place a tenant's notifications go.
//
// Its Secret never leaves the process except as signatures: String,
// GoString and LogValue omit it (and print the URL without its userinfo,
// query and fragment), so a Destination can be logged or formatted with
// any verb. Its JSON form is the file's and carries the secret: a job
// names a destination by tenant and Name (Registry.Destination), it does
// not carry one in its arguments.
type Destination struct {
	// Name identifies the destination within its tenant.
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	// URL is a webhook's endpoint.
	URL string `json:"url,omitempty"`
	// Secret is a webhook's HMAC key.
	Secret string `json:"secret,omitempty"`
	// TopicARN is an SNS destination's topic.
	TopicARN string `json:"topic_arn,omitempty"`
}

// Target is where the destination points, safe to print: a webhook's URL
// as scheme://host/path, an SNS destination's topic ARN.
func (d Destination) Target() string {
	if d.Kind == KindSNS {
		return d.TopicARN
	}
	return RedactURL(d.URL)
}

// String describes the destination without its secret.
func (d Destination) String() string {
	return fmt.Sprintf("%s %q (%s)", d.Kind, d.Name, d.Target())
}

// GoString is String, so that %#v does not print the secret either.
func (d Destination) GoString() string { return d.String() }

// LogValue logs the destination's name, kind and target, never its secret.
func (d Destination) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("name", d.Name),
		slog.String("kind", string(d.Kind)),
		slog.String("target", d.Target()),
	)
}

// RedactURL returns raw as scheme://host/path: without userinfo, query and
// fragment, which may carry tokens. A URL that does not parse is "(invalid
// URL)": its text could be anything.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid URL)"
	}
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	return r.String()
}

// Config is a parsed destinations file. The zero value (and nil) has no
// destinations.
type Config struct {
	tenants map[string][]Destination
}

// Destinations returns a copy of tenant's destinations in file order (none
// for a tenant the file does not name).
func (c *Config) Destinations(tenant string) []Destination {
	if c == nil {
		return nil
	}
	return append([]Destination(nil), c.tenants[tenant]...)
}

// Destination returns tenant's destination called name.
func (c *Config) Destination(tenant, name string) (Destination, bool) {
	if c == nil {
		return Destination{}, false
	}
	for _, d := range c.tenants[tenant] {
		if d.Name == name {
			return d, true
		}
	}
	return Destination{}, false
}

// Counts returns how many tenants and destinations the config holds.
func (c *Config) Counts() (tenants, destinations int) {
	if c == nil {
		return 0, 0
	}
	for _, ds := range c.tenants {
		destinations += len(ds)
	}
	return len(c.tenants), destinations
}

// FieldError is a destination Parse refused: which one, which field, why.
// It never holds the field's value.
type FieldError struct {
	Tenant string
	// Index is the destination's position in its tenant's list, from 0.
	Index int
	// Name is the destination's name, when it has a valid one.
	Name string
	// Field is the JSON field at fault.
	Field   string
	Problem string
}

func (e *FieldError) Error() string {
	name := ""
	if e.Name != "" {
		name = fmt.Sprintf(" (%q)", e.Name)
	}
	return fmt.Sprintf("tenant %q: destination %d%s: %s: %s", e.Tenant, e.Index, name, e.Field, e.Problem)
}

// Parse reads a destinations file (see the package documentation): strict
// JSON, every destination checked. An error names the tenant, the
// destination and the field, never a secret or a URL's userinfo or query.
func Parse(raw []byte) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var file struct {
		Tenants *tenantLists `json:"tenants"`
	}
	if err := dec.Decode(&file); err != nil {
		return nil, jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("notifications file: data after the top-level object")
	}
	if file.Tenants == nil {
		return nil, errors.New(`notifications file: no "tenants" object`)
	}
	c := &Config{tenants: map[string][]Destination{}}
	for _, t := range *file.Tenants {
		if err := batch.ValidateTenantID(t.tenant); err != nil {
			return nil, fmt.Errorf("notifications file: tenant %q: %w", t.tenant, err)
		}
		seen := map[string]int{}
		for i, d := range t.destinations {
			fe := func(field, problem string) error {
				return &FieldError{Tenant: t.tenant, Index: i, Name: d.Name, Field: field, Problem: problem}
			}
			if err := checkName(d.Name); err != "" {
				d.Name = "" // not printed: it is not a name
				return nil, fmt.Errorf("notifications file: %w", fe("name", err))
			}
			if first, dup := seen[d.Name]; dup {
				return nil, fmt.Errorf("notifications file: %w", fe("name", fmt.Sprintf("the same name as destination %d", first)))
			}
			seen[d.Name] = i
			field, problem := checkDestination(d)
			if problem != "" {
				return nil, fmt.Errorf("notifications file: %w", fe(field, problem))
			}
		}
		c.tenants[t.tenant] = t.destinations
	}
	return c, nil
}

// jsonError describes a decoding error without quoting the file: a syntax
// error by its offset, a type error by its field.
func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var dup *duplicateTenantError
	switch {
	case errors.As(err, &syn):
		return fmt.Errorf("notifications file: not valid JSON (at byte %d)", syn.Offset)
	case errors.As(err, &typ):
		return fmt.Errorf("notifications file: %s: a JSON %s where %s belongs (at byte %d)", typ.Field, typ.Value, typ.Type, typ.Offset)
	case errors.As(err, &dup):
		return fmt.Errorf("notifications file: %w", dup)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("notifications file: empty or truncated")
	}
	// Unknown fields: "json: unknown field \"x\"" names the key, not a value.
	return fmt.Errorf("notifications file: %w", err)
}

type tenantList struct {
	tenant       string
	destinations []Destination
}

// tenantLists is the "tenants" object in file order, refusing a tenant named
// twice (encoding/json would keep the last silently).
type tenantLists []tenantList

type duplicateTenantError struct{ tenant string }

func (e *duplicateTenantError) Error() string {
	return fmt.Sprintf("tenant %q appears twice", e.tenant)
}

func (l *tenantLists) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != json.Delim('{') {
		return errors.New(`"tenants" must be an object: {"<tenant id>": [<destination>, …]}`)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		tenant := tok.(string) // object keys are strings
		if seen[tenant] {
			return &duplicateTenantError{tenant}
		}
		seen[tenant] = true
		var ds []Destination
		if err := dec.Decode(&ds); err != nil {
			var typ *json.UnmarshalTypeError
			if errors.As(err, &typ) { // its text would not name the tenant
				return fmt.Errorf("tenant %q: %s: a JSON %s where a %s belongs", tenant, typ.Field, typ.Value, typ.Type)
			}
			if strings.HasPrefix(err.Error(), "json: unknown field") {
				return fmt.Errorf("tenant %q: %w", tenant, err)
			}
			return err
		}
		*l = append(*l, tenantList{tenant: tenant, destinations: ds})
	}
	_, err = dec.Token() // the closing brace
	return err
}

var nameRE = regexp.MustCompile(`^[a-z0-9_-]+$`)

func checkName(name string) string {
	switch {
	case name == "":
		return "must not be empty"
	case len(name) > MaxNameLen:
		return fmt.Sprintf("must be at most %d bytes", MaxNameLen)
	case !nameRE.MatchString(name):
		return "may hold only a-z, 0-9, '_' and '-'"
	}
	return ""
}

// topicARNRE is an SNS topic ARN: arn:<partition>:sns:<region>:<account>:<topic>,
// the topic 1 to 256 letters, digits, '_' and '-' (a FIFO topic's name ends
// in .fifo, within the 256).
var topicARNRE = regexp.MustCompile(`^arn:aws[a-z-]*:sns:[a-z]{2}(?:-[a-z]+)+-[0-9]+:[0-9]{12}:([A-Za-z0-9_-]+(?:\.fifo)?)$`)

// ValidTopicARN reports whether arn is a syntactically valid SNS topic ARN.
func ValidTopicARN(arn string) bool {
	m := topicARNRE.FindStringSubmatch(arn)
	if m == nil {
		return false
	}
	return len(m[1]) <= 256
}

// isFIFO reports whether the topic of a valid ARN is a FIFO topic.
func isFIFO(topicARN string) bool { return strings.HasSuffix(topicARN, ".fifo") }

// checkDestination checks a destination's kind and the fields of its kind,
// returning the field at fault and why.
func checkDestination(d Destination) (field, problem string) {
	switch d.Kind {
	case KindWebhook:
		if d.TopicARN != "" {
			return "topic_arn", "belongs to an sns destination, not a webhook"
		}
		if why := checkWebhookURL(d.URL); why != "" {
			return "url", why
		}
		if len(d.Secret) < MinSecretLen {
			return "secret", fmt.Sprintf("must be at least %d bytes", MinSecretLen)
		}
	case KindSNS:
		if d.URL != "" {
			return "url", "belongs to a webhook, not an sns destination"
		}
		if d.Secret != "" {
			return "secret", "belongs to a webhook, not an sns destination (SNS topics are reached with the worker's AWS credentials)"
		}
		if d.TopicARN == "" {
			return "topic_arn", "must not be empty"
		}
		if !ValidTopicARN(d.TopicARN) {
			return "topic_arn", "must be arn:<partition>:sns:<region>:<12-digit account>:<topic name>"
		}
	case "":
		return "kind", `must not be empty ("webhook" or "sns")`
	default:
		return "kind", `must be "webhook" or "sns"`
	}
	return "", ""
}

// checkWebhookURL checks a webhook URL without quoting it: https with a
// host, or http to a loopback host (development and tests).
func checkWebhookURL(raw string) string {
	if raw == "" {
		return "must not be empty"
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "is not a valid URL" // url.Error quotes the URL: not shown
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return "must be an absolute URL with a host"
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !loopback(u.Hostname()) {
			return "must be https (http only to a loopback host: 127.0.0.0/8, ::1, localhost)"
		}
	default:
		return "must be https (http only to a loopback host: 127.0.0.0/8, ::1, localhost)"
	}
	if u.Fragment != "" {
		return "must not have a fragment"
	}
	return ""
}

// loopback reports whether host is localhost or a loopback address.
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
