package folder

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidateBucketName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"abc", "fleet-uploads", "rt-bucket", "a.b.c", "bucket-1.example", strings.Repeat("a", 63)} {
		require.NoError(t, ValidateBucketName(ok), ok)
	}
	for name, why := range map[string]string{
		"ab":                                 "3 to 63",
		strings.Repeat("a", 64):              "3 to 63",
		"rt-bucket/tenants/acme/db1/c1/evil": "only letters",
		"Upper":                              "only letters",
		"bu_cket":                            "only letters",
		"-bucket":                            "only letters",
		"bucket-":                            "only letters",
		"a..b":                               "adjacent dots",
		"192.168.5.4":                        "IP address",
		"xn--bucket":                         "reserved prefix",
		"bucket-s3alias":                     "reserved suffix",
		"b\u202ekcu":                         "only letters",
		"":                                   "3 to 63",
	} {
		err := ValidateBucketName(name)
		require.ErrorIs(t, err, ErrInvalidFolder, name)
		require.ErrorContains(t, err, why, name)
	}
}

// TestSlashInABucketNameCannotMoveAFolderToAnotherTenant is the cross-tenant
// write of the second red-team round: a notification whose bucket name is
// "rt-bucket/tenants/acme/db1/c1/evil" and whose key names tenant victim
// used to become the folder s3://rt-bucket/tenants/acme/…/tenants/victim/…,
// loaded as victim. The bucket is refused by S3's naming rules; the tenant
// always comes from the canonical folder.
func TestSlashInABucketNameCannotMoveAFolderToAnotherTenant(t *testing.T) {
	t.Parallel()
	var m Mapping
	_, err := m.ResolveObjectFolder("rt-bucket/tenants/acme/db1/c1/evil", "tenants/victim/db1/c1")
	require.ErrorIs(t, err, ErrUnmapped)
	require.ErrorIs(t, err, ErrInvalidFolder)
	require.ErrorContains(t, err, "bucket name")

	for _, bucket := range []string{"RT-Bucket", "rt-bucket?x=1", "rt-bucket#f", "rt-bucket:443", "user@rt-bucket", "rt-bucket\\tenants"} {
		_, err := m.ResolveObjectFolder(bucket, "tenants/victim/db1/c1")
		require.Error(t, err, bucket)
	}

	// The tenant comes from the canonical folder, the prefix a worker lists.
	target, err := m.ResolveObjectFolder("rt-bucket", "tenants//victim/db1/c1/up-1")
	require.NoError(t, err)
	require.Equal(t, Target{TenantID: "victim", TenantDatabase: "db1", CompanyID: "c1", Folder: "s3://rt-bucket/tenants/victim/db1/c1/up-1"}, target)

	_, err = m.ResolveObjectFolder("rt-bucket", "tenants/../acme/db1/c1")
	require.ErrorIs(t, err, ErrInvalidFolder)
}

func TestMappingResolve(t *testing.T) {
	t.Parallel()
	m := Mapping{Buckets: []string{"allowed-bkt"}}
	require.NoError(t, m.Validate())
	f, err := Canonicalize("s3://allowed-bkt/tenants/acme/acme_db/c-7/2026/up")
	require.NoError(t, err)
	target, err := m.Resolve(f)
	require.NoError(t, err)
	require.Equal(t, "acme", target.TenantID)
	require.Equal(t, "acme_db", target.TenantDatabase)
	require.Equal(t, "c-7", target.CompanyID)

	for raw, why := range map[string]string{
		"s3://other-bkt/tenants/acme/acme_db/c-7/x": "not accepted",
		"s3://allowed-bkt/tenants/acme":             "does not match",
		"s3://allowed-bkt/people/acme/acme_db/c-7":  "does not match",
		"mem://allowed-bkt/tenants/acme/acme_db/c":  "only s3://",
	} {
		f, err := Canonicalize(raw)
		require.NoError(t, err, raw)
		_, err = m.Resolve(f)
		require.ErrorIs(t, err, ErrUnmapped, raw)
		require.ErrorContains(t, err, why, raw)
	}

	for _, bad := range []Mapping{
		{Pattern: "tenants/{tenant_id}/"},
		{Pattern: "t/{tenant_id}x/{tenant_database}/{company_id}/"},
		{Pattern: "t/../{tenant_id}/{tenant_database}/{company_id}/"},
		{Buckets: []string{"Bad/Bucket"}},
	} {
		require.Error(t, bad.Validate(), "%+v", bad)
	}
}

func TestFoldersRefuseInvisibleCharacters(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"s3://bucket/tenants/acme\u202e/db/c",   // right-to-left override
		"s3://bucket/tenants/ac\u200bme/db/c",   // zero-width space
		"s3://bucket/tenants/acme/db/c\u2066x",  // left-to-right isolate
		"s3://bucket/tenants/\ufeffacme/db/c",   // byte order mark
		"s3://bucket/tenants/acme\u2028/db/c",   // line separator
		"s3://bucket/tenants/acme\u2003/db/c",   // em space at a segment's end
		"s3://bucket/tenants/\u3000acme/db/c/x", // ideographic space at a segment's start
	} {
		_, err := Canonicalize(raw)
		require.True(t, errors.Is(err, ErrInvalidFolder), "%q: %v", raw, err)
	}
	f, err := Canonicalize("s3://bucket/tenants/ａｃｍｅ/db/c")
	require.NoError(t, err, "full-width letters are letters")
	require.Equal(t, "tenants/ａｃｍｅ/db/c", f.Prefix)
}

// TestFolderSegmentsAreAnAllowList: the red team's U+034F (combining
// grapheme joiner, a mark) and U+3164 (Hangul filler, a letter) render as
// nothing or as a blank and passed the deny-list of format characters. A
// path segment now holds only the characters of batch.PathSegmentCharacters,
// on every scheme; the error names the segment, the character and the
// allow-list. What existing folders use stays valid.
func TestFolderSegmentsAreAnAllowList(t *testing.T) {
	t.Parallel()
	for raw, char := range map[string]string{
		"s3://bucket/tenants/ac\u034fme/db/c":      "U+034F", // combining grapheme joiner
		"s3://bucket/tenants/\u3164/db/c":          "U+3164", // Hangul filler
		"s3://bucket/tenants/acme\u3164/db/c":      "U+3164",
		"s3://bucket/tenants/\u115facme/db/c":      "U+115F", // Hangul choseong filler
		"s3://bucket/tenants/acme\uffa0/db/c":      "U+FFA0", // half-width Hangul filler
		"s3://bucket/tenants/acme\ufe0f/db/c":      "U+FE0F", // variation selector
		"s3://bucket/tenants/acme\u00a0x/db/c":     "U+00A0", // no-break space inside
		"s3://bucket/tenants/\u2800/db/c":          "U+2800", // braille blank
		"s3://bucket/tenants/\u0301acme/db/c":      "U+0301", // a mark first, on the slash
		"s3://bucket/tenants/a~b/db/c":             `'~'`,
		"s3://bucket/tenants/a{b}/db/c":            `'{'`,
		"s3://bucket/tenants/a|b/db/c":             `'|'`,
		"s3://bucket/tenants/a\"b/db/c":            `'"'`,
		"s3://bucket/tenants/a<b>/db/c":            `'<'`,
		"s3://bucket/tenants/a^b/db/c":             `'^'`,
		"s3://bucket/tenants/a[1]/db/c":            `'['`,
		"s3://bucket/tenants/a`b/db/c":             "'`'",
		"mem://bucket/a\u3164/x":                   "U+3164",
		"file:///tmp/ac\u034fme":                   "U+034F",
		"s3://bucket/tenants/acme/db/c/\U0001F600": "U+1F600", // an emoji is not a letter
	} {
		_, err := Canonicalize(raw)
		require.ErrorIs(t, err, ErrInvalidFolder, raw)
		require.ErrorContains(t, err, char, raw)
		require.ErrorContains(t, err, "path segment", raw)
		require.ErrorContains(t, err, "only letters, digits", raw)
	}
	for _, raw := range []string{
		"s3://bucket/tenants/acme/acme_db/c-7/2026-11-30/up-1",
		"s3://bucket/exports/date=2026-12-01/hour=10:00/part+1,2/(copy)!*'/a&b$c@d;e",
		"s3://bucket/a%2Fb/Upload 7/.dev/_tmp",
		"s3://bucket/tenants/ÄÖ/日本/Zoë/ｅ/租户/देवनागरी", // marks after the first letter
		"file:///tmp/fleet/.dev/sample/fleet/tenant-demo/2026-11-30/upload-1",
	} {
		_, err := Canonicalize(raw)
		require.NoError(t, err, raw)
	}
}
