package folder

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/fleet/ingest/internal/batch"
)

// Mapping says which tenant, database and company an S3 folder belongs to.
// It is the one rule every door applies — the HTTP import, the event route
// (plain, SNS and EventBridge notifications), the command line and the
// worker, which re-checks each batch before it reads a byte — so a folder
// can only ever be imported as the tenant its canonical path names.
type Mapping struct {
	// Pattern is matched against the canonical folder's key prefix, segment
	// by segment. Placeholders {tenant_id}, {tenant_database} and
	// {company_id} capture one segment each; other segments must match
	// literally; the folder may go deeper than the pattern. Defaults to
	// DefaultPattern.
	Pattern string
	// Buckets, if not empty, are the only buckets accepted. Empty accepts
	// any bucket whose name is a valid S3 bucket name (ValidateBucketName);
	// the Helm chart refuses to render without a list.
	Buckets []string
}

// DefaultPattern is the default Mapping.Pattern.
const DefaultPattern = "tenants/{tenant_id}/{tenant_database}/{company_id}/"

// ErrUnmapped is wrapped when a folder matches no mapping, or its bucket is
// not accepted.
var ErrUnmapped = errors.New("folder is not mapped to a tenant")

// Target is what a mapped folder imports as: the canonical folder URL and
// the tenant, database and company its path names.
type Target struct {
	TenantID, TenantDatabase, CompanyID, Folder string
}

// Validate checks the pattern names each placeholder once, its other
// segments hold only the characters of a folder's path segments
// (batch.CheckPathSegment), and the bucket allow-list holds valid bucket
// names.
func (m Mapping) Validate() error {
	p := m.pattern()
	for _, ph := range []string{"{tenant_id}", "{tenant_database}", "{company_id}"} {
		if strings.Count(p, ph) != 1 {
			return fmt.Errorf("mapping pattern %q must contain %s exactly once", p, ph)
		}
	}
	for _, seg := range strings.Split(strings.Trim(p, "/"), "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("mapping pattern %q has an empty, '.' or '..' segment", p)
		}
		switch {
		case seg == "{tenant_id}" || seg == "{tenant_database}" || seg == "{company_id}":
		case strings.Contains(seg, "{"):
			return fmt.Errorf("mapping pattern %q: a placeholder must be a whole segment, got %q", p, seg)
		default:
			// A literal segment no canonical folder could hold would match
			// nothing.
			if err := batch.CheckPathSegment(seg); err != nil {
				return fmt.Errorf("mapping pattern %q: %w", p, err)
			}
		}
	}
	for _, b := range m.Buckets {
		if err := ValidateBucketName(b); err != nil {
			return fmt.Errorf("bucket allow-list: %w", err)
		}
	}
	return nil
}

func (m Mapping) pattern() string {
	if m.Pattern == "" {
		return DefaultPattern
	}
	return m.Pattern
}

// BucketAccepted reports whether bucket is a valid S3 bucket name on the
// allow-list (any valid name when the list is empty).
func (m Mapping) BucketAccepted(bucket string) error {
	if err := ValidateBucketName(bucket); err != nil {
		return fmt.Errorf("%w: %w", ErrUnmapped, err)
	}
	if len(m.Buckets) == 0 {
		return nil
	}
	for _, b := range m.Buckets {
		if b == bucket {
			return nil
		}
	}
	return fmt.Errorf("%w: bucket %q is not accepted", ErrUnmapped, bucket)
}

// Resolve maps a canonical s3:// folder to its target: the bucket must be
// accepted (BucketAccepted) and the prefix must match the pattern, whose
// placeholders name the tenant, database and company. Errors wrap
// ErrUnmapped. The values are not validated as batch fields here; the
// reservation does that.
func (m Mapping) Resolve(f Folder) (Target, error) {
	if f.Scheme != SchemeS3 {
		return Target{}, fmt.Errorf("%w: only s3:// folders are mapped to tenants, got %s://", ErrUnmapped, f.Scheme)
	}
	if err := m.BucketAccepted(f.Bucket); err != nil {
		return Target{}, err
	}
	want := strings.Split(strings.Trim(m.pattern(), "/"), "/")
	got := strings.Split(f.Prefix, "/")
	if len(got) < len(want) {
		return Target{}, fmt.Errorf("%w: %q does not match %q", ErrUnmapped, f.Prefix, m.pattern())
	}
	t := Target{Folder: f.String()}
	for i, w := range want {
		switch w {
		case "{tenant_id}":
			t.TenantID = got[i]
		case "{tenant_database}":
			t.TenantDatabase = got[i]
		case "{company_id}":
			t.CompanyID = got[i]
		default:
			if w != got[i] {
				return Target{}, fmt.Errorf("%w: %q does not match %q", ErrUnmapped, f.Prefix, m.pattern())
			}
		}
	}
	return t, nil
}

// ResolveObjectFolder maps the folder holding an object named by a storage
// notification — a bucket name and a directory of object keys, as the
// event gave them — to its target. The bucket must be a valid S3 bucket
// name as given (no slash, no upper case: a name such as
// "bkt/tenants/acme/…" would otherwise move the folder under another
// tenant's prefix), and the tenant comes from the canonical folder, exactly
// the prefix the worker will list. Errors wrap ErrUnmapped or
// ErrInvalidFolder.
func (m Mapping) ResolveObjectFolder(bucket, dir string) (Target, error) {
	if err := m.BucketAccepted(bucket); err != nil {
		return Target{}, err
	}
	f, err := Canonicalize(SchemeS3 + "://" + bucket + "/" + dir)
	if err != nil {
		return Target{}, err
	}
	if f.Bucket != bucket {
		// Unreachable after ValidateBucketName; kept as the invariant.
		return Target{}, fmt.Errorf("%w: bucket %q is not canonical", ErrUnmapped, bucket)
	}
	return m.Resolve(f)
}

// ValidateBucketName checks a bucket name by Amazon S3's naming rules for
// general purpose buckets: 3 to 63 characters; lower-case letters, digits,
// dots and hyphens only; beginning and ending with a letter or digit; no
// two adjacent dots; not formatted as an IP address; none of the prefixes
// and suffixes S3 reserves. Errors wrap ErrInvalidFolder.
func ValidateBucketName(name string) error {
	if len(name) < 3 || len(name) > 63 {
		return invalid("bucket name %q must be 3 to 63 characters", truncate(name, 80))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
		if !alnum && (i == 0 || i == len(name)-1 || (c != '.' && c != '-')) {
			return invalid("bucket name %q: only letters (lower case), digits, '.' and '-', beginning and ending with a letter or digit", truncate(name, 80))
		}
	}
	if strings.Contains(name, "..") {
		return invalid("bucket name %q has two adjacent dots", name)
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return invalid("bucket name %q is formatted as an IP address", name)
	}
	for _, p := range []string{"xn--", "sthree-", "amzn-s3-demo-"} {
		if strings.HasPrefix(name, p) {
			return invalid("bucket name %q begins with the reserved prefix %q", name, p)
		}
	}
	for _, s := range []string{"-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"} {
		if strings.HasSuffix(name, s) {
			return invalid("bucket name %q ends with the reserved suffix %q", name, s)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
