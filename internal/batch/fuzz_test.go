package batch_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/fleet/ingest/internal/batch"
)

// FuzzParseDetails: any document either parses into a current-version
// document that round-trips, or is refused with ErrDetailsInvalid or
// ErrDetailsUnknownVersion; never a panic, never a guess. What parses
// writes back every top-level key this build does not know, with its
// value, and writing what it wrote is a fixed point. The seed corpus runs
// in every normal test run.
func FuzzParseDetails(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"phase":"reserved","redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		`{"version":1,"phase":"committed","redshiftCommitted":true,"committedAt":"2026-11-30T10:00:00Z","writes":[{"phase":"committed","status":"Running","leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z"}]}`,
		`{"version":1,"phase":"publishing","objects":{"count":1,"bytes":2,"digest":"d","extra":[1,{"a":null}]},"publication":{"started":true,"completed":false,"by":"x"},"newer":{"k":"v"}}`,
		`{"version":1,"phase":"loading","Newer":1,"newer":2}`, `{"version":1,"phase":"loading","Phase":"loading"}`,
		`{"version":2,"phase":"loading"}`, `{"version":"1"}`, `{"version":1}`, `[]`, `null`, `{}`, `"x"`, ``,
		`{"version":1,"phase":"loading","redshiftCommitted":"yes"}`, `{"version":1e400,"phase":"x"}`,
		`{"version":1,"phase":"loading","\u00e9t\u00e9":"<&>"}`,
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
		twice, err := d2.Marshal()
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		if !bytes.Equal(again, twice) {
			t.Fatalf("writing what it wrote changed it:\n%s\n%s", again, twice)
		}
		var in, out map[string]json.RawMessage
		if err := json.Unmarshal(raw, &in); err != nil {
			t.Fatalf("parsed a document encoding/json refuses: %v", err)
		}
		if err := json.Unmarshal(again, &out); err != nil {
			t.Fatalf("wrote a document encoding/json refuses: %v", err)
		}
		for key, value := range in {
			if known[key] {
				continue
			}
			kept, ok := out[key]
			if !ok {
				t.Fatalf("the unknown key %q was not written back", key)
			}
			if !sameJSON(t, value, kept) {
				t.Fatalf("the unknown key %q was written back as %s, not %s", key, kept, value)
			}
		}
	})
}

// known are the top-level keys of a details document this build knows:
// the json names of Details's fields.
var known = func() map[string]bool {
	keys := map[string]bool{}
	for f := range reflect.TypeFor[batch.Details]().Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
			keys[name] = true
		}
	}
	return keys
}()

// sameJSON reports whether two JSON values are equal as values (numbers
// compared as written).
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	decode := func(raw []byte) (any, error) {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		return v, dec.Decode(&v)
	}
	va, errA := decode(a)
	vb, errB := decode(b)
	return errA == nil && errB == nil && reflect.DeepEqual(va, vb)
}

// TestIsInvisibleIsTheUnicodeCategories checks IsInvisible against its
// definition (Unicode categories Cf, Zl and Zp, the code points Unicode
// declares ignorable by default beyond them, and the variation selectors)
// for every code point, its ASCII shortcut included.
func TestIsInvisibleIsTheUnicodeCategories(t *testing.T) {
	t.Parallel()
	for r := rune(0); r <= unicode.MaxRune; r++ {
		want := unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
		if got := batch.IsInvisible(r); got != want {
			t.Fatalf("IsInvisible(U+%04X) = %v, want %v", r, got, want)
		}
	}
}

// TestAllowListsAreTheirDefinition checks, for every code point, that an
// identifier (tenant or company id) and a folder path segment accept it
// after a first letter exactly when its documented allow-list holds it —
// letters, decimal digits and combining marks that Unicode does not
// declare ignorable by default, and the listed ASCII punctuation — and
// that neither ever accepts a control, invisible or non-ASCII space
// character.
func TestAllowListsAreTheirDefinition(t *testing.T) {
	t.Parallel()
	assigned := []*unicode.RangeTable{unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z, unicode.Cc, unicode.Cf,
		unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector}
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue // surrogates have no UTF-8 form
		}
		if r > 0xFFFF && !unicode.In(r, assigned...) {
			// Unassigned and private-use code points past the first
			// plane (0.9 million: the time of this test under -race);
			// no letter, digit or mark is among them.
			continue
		}
		name := !unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector) &&
			(unicode.IsLetter(r) || unicode.Is(unicode.Nd, r) || unicode.In(r, unicode.Mn, unicode.Mc))
		wantID := name || strings.ContainsRune("-_. ", r)
		wantSegment := name || strings.ContainsRune("!-_.*'()&$@=;:+,% ", r)
		value := "a" + string(r) + "a"
		gotID := batch.ValidateTenantID(value) == nil
		gotSegment := batch.CheckPathSegment(value) == nil
		if gotID != wantID || gotSegment != wantSegment {
			t.Fatalf("U+%04X: identifier %v (want %v), path segment %v (want %v)", r, gotID, wantID, gotSegment, wantSegment)
		}
		if (gotID || gotSegment) && (unicode.IsControl(r) || batch.IsInvisible(r) || (unicode.IsSpace(r) && r != ' ')) {
			t.Fatalf("U+%04X is accepted but is a control, invisible or non-ASCII space character", r)
		}
	}
}

// FuzzIdentifierAllowList: any string ValidateTenantID accepts is valid
// UTF-8 of at most MaxTenantIDLen bytes, starts with a letter or a digit,
// ends with no space and holds no control, invisible or non-ASCII space
// character; and ValidateCompanyID agrees. The seed corpus runs in every
// normal test run.
func FuzzIdentifierAllowList(f *testing.F) {
	for _, s := range []string{"acme", "tenant-a", "ａｃｍｅ", "tenant ｅ", "Zoë", "租户", "ac\u034fme", "\u3164", "ac\u3164me",
		"\u115facme", "acme\ufe0f", "\u0301acme", " acme", "acme ", "-acme", "_acme", "o'hara", "a/b", "acme\u00a0x", "t\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := batch.ValidateTenantID(s)
		if (err == nil) != (batch.ValidateCompanyID(s) == nil) {
			t.Fatalf("tenant and company ids disagree on %q", s)
		}
		if err != nil {
			return
		}
		if !utf8.ValidString(s) || len(s) > batch.MaxTenantIDLen || strings.HasSuffix(s, " ") {
			t.Fatalf("accepted %q", s)
		}
		for i, r := range s {
			if i == 0 && !unicode.IsLetter(r) && !unicode.IsDigit(r) {
				t.Fatalf("accepted %q, which starts with U+%04X", s, r)
			}
			if unicode.IsControl(r) || batch.IsInvisible(r) || (unicode.IsSpace(r) && r != ' ') {
				t.Fatalf("accepted %q, which holds U+%04X", s, r)
			}
		}
	})
}
