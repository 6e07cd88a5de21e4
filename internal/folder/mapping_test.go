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
