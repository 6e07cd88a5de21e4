package folder

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
)

func TestCanonicalize(t *testing.T) {
	t.Parallel()
	ok := []struct{ in, want string }{
		{"s3://bucket/a/b", "s3://bucket/a/b"},
		{"s3://Bucket//a/b", "s3://bucket/a/b"},
		{"s3://bucket/a/b/", "s3://bucket/a/b"},
		{"S3://BUCKET/A/b", "s3://bucket/A/b"},
		{"s3://my.bucket-1/Fleet/2026-11-30/Upload 7", "s3://my.bucket-1/Fleet/2026-11-30/Upload 7"},
		{"s3://bucket///x//y///", "s3://bucket/x/y"},
		{"s3://bucket/a%2Fb", "s3://bucket/a%2Fb"},
		{"s3://bucket/tenants/ÄÖ/日本", "s3://bucket/tenants/ÄÖ/日本"},
		{"mem://tests/folder", "mem://tests/folder"},
		{"file:///tmp/fleet/folder/", "file:///tmp/fleet/folder"},
		{"file://localhost/tmp/x", "file:///tmp/x"},
		{"FILE:////tmp//x", "file:///tmp/x"},
	}
	for _, tt := range ok {
		f, err := Canonicalize(tt.in)
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.want, f.String(), tt.in)
		require.Equal(t, ScopePrefix+tt.want, f.Scope())
		again, err := Canonicalize(f.String())
		require.NoError(t, err)
		require.Equal(t, f, again, "idempotent")
	}

	bad := []struct{ in, why string }{
		{"", "want a URL"},
		{"bucket/a", "want a URL"},
		{"http://bucket/a", "unsupported scheme"},
		{"gs://bucket/a", "unsupported scheme"},
		{"s3://bucket", "empty path"},
		{"s3://bucket/", "empty path"},
		{"s3://bucket///", "empty path"},
		{"s3:///a/b", "empty bucket"},
		{"s3://bucket/a/../b", `".."`},
		{"s3://bucket/..", `".."`},
		{"s3://bucket/./a", `"."`},
		{"s3://bucket/a?region=us-east-1", "query strings"},
		{"s3://bucket/a#frag", "fragments"},
		{"s3://bucket/a\x00b", "control character"},
		{"s3://bucket/a\nb", "control character"},
		{"s3://bucket/a\x7fb", "control character"},
		{"s3://bucket/\xff", "UTF-8"},
		{"s3://user:pw@bucket/a", "user info"},
		{"s3://bucket:9000/a", "ports"},
		{"s3://b/a", "3 to 63"},
		{"s3://bu_cket/a", "only letters"},
		{"s3://-bucket/a", "only letters"},
		{"s3://bucket/a\\b", "backslashes"},
		{"s3://bucket/ a", "whitespace"},
		{"file://otherhost/tmp/x", "must be local"},
		{"file:///", "empty path"},
		{"s3://bucket/" + strings.Repeat("a", 200-len("fleet_s3:s3://bucket/")+1), "more than 200"},
	}
	for _, tt := range bad {
		_, err := Canonicalize(tt.in)
		require.ErrorIs(t, err, ErrInvalidFolder, tt.in)
		require.ErrorContains(t, err, tt.why, tt.in)
	}

	exactly := "s3://bucket/" + strings.Repeat("a", 200-len("fleet_s3:s3://bucket/"))
	f, err := Canonicalize(exactly)
	require.NoError(t, err)
	require.Len(t, f.Scope(), 200)
}

// FuzzCanonicalize checks the properties of canonical folders on any input:
// no panic; success implies a valid, bounded scope without forbidden parts
// (every path segment within the allow-list, no invisible character);
// canonicalisation is idempotent; and every failure wraps ErrInvalidFolder.
// The seed corpus runs in every normal test run.
func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{
		"s3://bucket/a/b", "s3://Bucket//a/b", "s3://bucket/a/b/", "mem://tests/x", "file:///tmp/x",
		"s3://bucket/a/../b", "s3://bucket/a?x=1", "s3://bucket", "", "s3://bucket/\x00", "s3://b\xffucket/a",
		"file://host/x", "s3://bucket/%2e%2e/a", "S3://BUCKET/Key/Case", "s3://bucket//./",
		"s3://bucket/ac\u034fme/x", "s3://bucket/\u3164/x", "s3://bucket/date=2026-12-01/10:00", "s3://bucket/a~b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		folder, err := Canonicalize(raw)
		if err != nil {
			if !errors.Is(err, ErrInvalidFolder) {
				t.Fatalf("error does not wrap ErrInvalidFolder: %v", err)
			}
			return
		}
		scope := folder.Scope()
		if len(scope) > batch.MaxSourceScopeLen {
			t.Fatalf("scope too long: %d", len(scope))
		}
		if err := batch.ValidateSourceScope(scope); err != nil {
			t.Fatalf("canonical scope fails store validation: %v", err)
		}
		if !utf8.ValidString(scope) || strings.ContainsAny(folder.Prefix, "?#\\") {
			t.Fatalf("forbidden characters survived: %q", scope)
		}
		for _, r := range scope {
			if unicode.IsControl(r) {
				t.Fatalf("control character survived: %q", scope)
			}
		}
		for _, seg := range strings.Split(folder.Prefix, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("bad segment %q in %q", seg, folder.Prefix)
			}
			if err := batch.CheckPathSegment(seg); err != nil {
				t.Fatalf("segment %q of %q is outside the allow-list: %v", seg, folder.Prefix, err)
			}
		}
		for _, r := range scope {
			if batch.IsInvisible(r) {
				t.Fatalf("invisible character U+%04X survived: %q", r, scope)
			}
		}
		if folder.Bucket != strings.ToLower(folder.Bucket) {
			t.Fatalf("bucket not lower-cased: %q", folder.Bucket)
		}
		again, err := Canonicalize(folder.String())
		if err != nil {
			t.Fatalf("canonical form %q refused: %v", folder.String(), err)
		}
		if again != folder {
			t.Fatalf("not idempotent: %+v then %+v", folder, again)
		}
	})
}

func TestSummaryDigestsKeysAndETagsAndCountsLateObjects(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	l := Listing{
		Objects: []Object{
			{Key: "t/up/b.csv", Size: 5, ETag: "e2", LastModified: t0.Add(2 * time.Minute)},
			{Key: "t/up/a.csv", Size: 3, ETag: "e1", LastModified: t0},
		},
		Markers: []Object{{Key: "_SUCCESS", LastModified: t0.Add(time.Minute)}},
	}
	s := Summarize(l, "_SUCCESS")
	require.EqualValues(t, 2, s.Count)
	require.EqualValues(t, 8, s.Bytes)
	require.Equal(t, t0.Add(2*time.Minute), *s.NewestModified)
	require.Equal(t, t0.Add(time.Minute), *s.MarkerModified)
	require.Equal(t, "_SUCCESS", s.Marker)
	require.EqualValues(t, 1, s.Late)
	require.Equal(t, []string{"t/up/b.csv"}, Late(l, "_SUCCESS"))

	// The digest does not depend on order, and changes with a key or an ETag.
	swapped := Listing{Objects: []Object{l.Objects[1], l.Objects[0]}}
	require.Equal(t, s.Digest, Digest(swapped.Objects))
	changed := []Object{l.Objects[0], {Key: "t/up/a.csv", ETag: "e1-new"}}
	require.NotEqual(t, s.Digest, Digest(changed))
	added := append([]Object{{Key: "t/up/c.csv", ETag: "e3"}}, l.Objects...)
	require.NotEqual(t, s.Digest, Digest(added))

	// No marker: no marker fields, nothing late.
	none := Summarize(Listing{Objects: l.Objects}, "_SUCCESS")
	require.Empty(t, none.Marker)
	require.Nil(t, none.MarkerModified)
	require.Zero(t, none.Late)
	require.Nil(t, Late(Listing{Objects: l.Objects}, "_SUCCESS"))
}
