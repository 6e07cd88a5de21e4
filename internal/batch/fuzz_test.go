package batch_test

import (
	"errors"
	"testing"
	"unicode"

	"github.com/fleet/ingest/internal/batch"
)

// FuzzParseDetails: any document either parses into a current-version
// document that round-trips, or is refused with ErrDetailsInvalid or
// ErrDetailsUnknownVersion; never a panic, never a guess. The seed corpus
// runs in every normal test run.
func FuzzParseDetails(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"phase":"reserved","redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		`{"version":1,"phase":"committed","redshiftCommitted":true,"committedAt":"2026-11-30T10:00:00Z","writes":[{"phase":"committed","status":"Running","leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z"}]}`,
		`{"version":2,"phase":"loading"}`, `{"version":"1"}`, `{"version":1}`, `[]`, `null`, `{}`, `"x"`, ``,
		`{"version":1,"phase":"loading","redshiftCommitted":"yes"}`, `{"version":1e400,"phase":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		d, err := batch.ParseDetails(raw)
		if err != nil {
			if !errors.Is(err, batch.ErrDetailsInvalid) && !errors.Is(err, batch.ErrDetailsUnknownVersion) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if d.Version != batch.DetailsVersion || d.Phase == "" {
			t.Fatalf("parsed a document it should have refused: %+v", d)
		}
		again, err := d.Marshal()
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		d2, err := batch.ParseDetails(again)
		if err != nil {
			t.Fatalf("round trip refused: %v", err)
		}
		if d2.Phase != d.Phase || d2.RedshiftCommitted != d.RedshiftCommitted || len(d2.Writes) != len(d.Writes) {
			t.Fatalf("round trip changed the document")
		}
	})
}

// TestIsInvisibleIsTheUnicodeCategories checks IsInvisible against its
// definition (Unicode categories Cf, Zl and Zp) for every code point, its
// ASCII shortcut included.
func TestIsInvisibleIsTheUnicodeCategories(t *testing.T) {
	t.Parallel()
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if got, want := batch.IsInvisible(r), unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp); got != want {
			t.Fatalf("IsInvisible(U+%04X) = %v, want %v", r, got, want)
		}
	}
}
