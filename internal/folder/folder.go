// Package folder names Fleet source folders canonically and reads their
// objects as streams of records.
package folder

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fleet/ingest/internal/batch"
)

// ScopePrefix prefixes the source scope of every Fleet batch.
const ScopePrefix = "fleet_s3:"

// Schemes a folder URL may use: s3 in production, file and mem locally and
// in tests.
const (
	SchemeS3   = "s3"
	SchemeFile = "file"
	SchemeMem  = "mem"
)

// Folder is a canonical source folder: a bucket and a key prefix of at least
// one segment, without leading or trailing slashes. For file URLs Bucket is
// empty and Prefix is the absolute directory path without its leading slash.
type Folder struct {
	Scheme string
	Bucket string
	Prefix string
}

// String returns the canonical URL of the folder: s3://bucket/a/b,
// mem://bucket/a/b or file:///a/b. Canonicalize(f.String()) returns f.
func (f Folder) String() string {
	return f.Scheme + "://" + f.Bucket + "/" + f.Prefix
}

// Scope returns the batch source scope of the folder: fleet_s3:{canonical}.
func (f Folder) Scope() string { return ScopePrefix + f.String() }

// ErrInvalidFolder is wrapped by every error of Canonicalize.
var ErrInvalidFolder = errors.New("invalid source folder")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidFolder, fmt.Sprintf(format, args...))
}

// Canonicalize turns a folder URL into its canonical Folder. It is
// deterministic and idempotent: the scheme and the bucket are lower-cased,
// object key segments keep their case, repeated and trailing slashes are
// dropped, so s3://Bucket//a/b and s3://bucket/a/b/ name the same folder.
//
// It rejects, with an error wrapping ErrInvalidFolder: anything but s3, mem
// and file URLs; invalid UTF-8 and control characters; query strings and
// fragments; user info and ports; "." and ".." segments; an empty bucket or
// empty path (a bucket root is not a folder); backslashes; a path segment
// holding a character outside the allow-list batch.PathSegmentCharacters
// (batch.CheckPathSegment: letters, digits, combining marks and S3's safe
// punctuation, for every scheme, so no invisible formatting character,
// filler or blank passes; the bucket is ASCII by S3's naming rules); and
// any folder whose scope would exceed
// batch.MaxSourceScopeLen bytes.
//
// Key segments are taken literally: percent signs are not decoded, so the
// canonical name is exactly the object key prefix in storage.
func Canonicalize(raw string) (Folder, error) {
	if !utf8.ValidString(raw) {
		return Folder{}, invalid("not valid UTF-8")
	}
	for _, r := range raw {
		if unicode.IsControl(r) {
			return Folder{}, invalid("contains a control character")
		}
	}
	if len(raw) > 4*batch.MaxSourceScopeLen {
		return Folder{}, invalid("too long")
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return Folder{}, invalid("want a URL such as s3://bucket/folder, got %q", raw)
	}
	scheme = strings.ToLower(scheme)
	if strings.ContainsAny(rest, "?#") {
		return Folder{}, invalid("query strings and fragments are not allowed")
	}
	if strings.Contains(rest, `\`) {
		return Folder{}, invalid("backslashes are not allowed")
	}
	var f Folder
	switch scheme {
	case SchemeS3, SchemeMem:
		host, path, _ := strings.Cut(rest, "/")
		bucket, err := canonicalBucket(host)
		if err != nil {
			return Folder{}, err
		}
		f = Folder{Scheme: scheme, Bucket: bucket}
		rest = path
	case SchemeFile:
		host, path, _ := strings.Cut(rest, "/")
		if host != "" && !strings.EqualFold(host, "localhost") {
			return Folder{}, invalid("file URLs must be local: file:///absolute/path")
		}
		f = Folder{Scheme: scheme}
		rest = path
	default:
		return Folder{}, invalid("unsupported scheme %q: use s3://, file:// or mem://", scheme)
	}
	var segments []string
	for _, s := range strings.Split(rest, "/") {
		switch s {
		case "":
			continue
		case ".", "..":
			return Folder{}, invalid("%q path segments are not allowed", s)
		}
		if strings.TrimSpace(s) != s {
			return Folder{}, invalid("path segments must not start or end with whitespace")
		}
		if err := batch.CheckPathSegment(s); err != nil {
			return Folder{}, invalid("path segment %d: %v", len(segments)+1, err)
		}
		segments = append(segments, s)
	}
	if len(segments) == 0 {
		return Folder{}, invalid("empty path: name a folder inside the bucket")
	}
	f.Prefix = strings.Join(segments, "/")
	if n := len(f.Scope()); n > batch.MaxSourceScopeLen {
		return Folder{}, invalid("scope would be %d bytes, more than %d", n, batch.MaxSourceScopeLen)
	}
	return f, nil
}

// canonicalBucket lower-cases host and checks it is a bucket name by
// Amazon S3's rules (ValidateBucketName).
func canonicalBucket(host string) (string, error) {
	if host == "" {
		return "", invalid("empty bucket name")
	}
	if strings.ContainsAny(host, "@:") {
		return "", invalid("user info and ports are not allowed in a bucket URL")
	}
	b := strings.ToLower(host)
	if err := ValidateBucketName(b); err != nil {
		return "", err
	}
	return b, nil
}
