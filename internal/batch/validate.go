package batch

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Bounds of the values a batch stores. They mirror the column sizes, so a
// value that passes validation always fits.
const (
	MaxCompanyIDLen      = 100
	MaxTenantIDLen       = 100
	MaxTenantDatabaseLen = 63 // PostgreSQL and Redshift identifier limits
	MaxSourceScopeLen    = 200
	MaxPipelineStageLen  = 100
	MaxLeaseIDLen        = 100
)

// ValidationError reports an input value that was refused before anything
// was written. Field names the offending input in snake_case.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string { return e.Field + ": " + e.Reason }

// IsInvisible reports whether r is a character that changes how the text
// around it is shown, or is not shown at all, without being a control
// character: Unicode format characters (Cf: bidirectional overrides and
// isolates, zero-width spaces and joiners, the byte order mark, …), the
// line and paragraph separators (Zl, Zp), and the characters Unicode
// declares ignorable by default although their category is a letter or a
// mark (Other_Default_Ignorable_Code_Point: U+034F COMBINING GRAPHEME
// JOINER, the Hangul fillers U+115F, U+1160, U+3164 and U+FFA0, …) and the
// variation selectors. A name holding one can look like another name, so
// free-form text refuses them; identifiers and folder path segments go
// further and accept only the characters of an allow-list
// (ValidateTenantID, CheckPathSegment).
func IsInvisible(r rune) bool {
	if r < utf8.RuneSelf {
		// No ASCII character is one, and identifiers and folder paths are
		// mostly ASCII: the table look-up was a tenth of enqueue serve's
		// CPU per import.
		return false
	}
	return unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}

// IdentifierCharacters states the allow-list of tenant and company ids, as
// errors and the README say it.
const IdentifierCharacters = "letters, digits, combining marks (not first), '-', '_', '.' and spaces (not at either end), starting with a letter or a digit"

// PathSegmentCharacters states the allow-list of a folder's path segments,
// as errors and the README say it.
const PathSegmentCharacters = "letters, digits, combining marks (not first), the characters S3 calls safe ! - _ . * ' ( ), " +
	"and & $ @ = ; : + , % and spaces (not at either end)"

// asciiIdentifier and asciiSegment are the ASCII characters of the two
// allow-lists, beside letters and digits. Segments add S3's safe
// characters and those S3 documents as needing special handling in a URL
// (& $ @ = ; : + , and the space) but common in keys (date=2026-12-01,
// 10:00); they leave out the characters S3 asks to avoid
// (\ { } ^ ` [ ] " < > ~ # |; its list has % too, kept here because keys
// such as a%2Fb are in use), ? (a query) and / (the separator).
const (
	asciiIdentifier = "-_. "
	asciiSegment    = "!-_.*'()&$@=;:+,% "
)

var identifierASCII, segmentASCII = asciiTable(asciiIdentifier), asciiTable(asciiSegment)

func asciiTable(extra string) (t [utf8.RuneSelf]bool) {
	for c := range t {
		t[c] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
	}
	for _, c := range extra {
		t[c] = true
	}
	return t
}

// nameRune reports whether r, beyond ASCII, is a letter, a decimal digit or
// a combining mark (mark is then true) that Unicode does not declare
// ignorable by default: the non-ASCII part of both allow-lists.
func nameRune(r rune) (ok, mark bool) {
	switch {
	case unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector):
		return false, false
	case unicode.IsLetter(r) || unicode.Is(unicode.Nd, r):
		return true, false
	case unicode.In(r, unicode.Mn, unicode.Mc):
		return true, true
	}
	return false, false
}

// checkAllowed checks value, not empty, against an allow-list: table for
// ASCII, and letters, decimal digits and (not first) combining marks
// beyond it. A space may not be first or last; with letterFirst, the first
// character must be a letter or a digit. The reason names the first
// character refused by its code point (it may not show when printed) and
// states the allow-list.
func checkAllowed(value string, table *[utf8.RuneSelf]bool, letterFirst bool, allowed string) string {
	for i, r := range value {
		var ok, mark bool
		if r < utf8.RuneSelf {
			ok = table[r]
		} else {
			ok, mark = nameRune(r)
		}
		if !ok {
			return fmt.Sprintf("character %s is not allowed: only %s", describeRune(r), allowed)
		}
		if i == 0 && (mark || (letterFirst && !unicode.IsLetter(r) && !unicode.IsDigit(r))) {
			return fmt.Sprintf("must not start with %s: only %s", describeRune(r), allowed)
		}
	}
	if value[0] == ' ' || value[len(value)-1] == ' ' {
		return "must not start or end with a space: only " + allowed
	}
	return ""
}

// describeRune names r by its code point, and shows it too when it is
// printable ASCII.
func describeRune(r rune) string {
	if r > ' ' && r < utf8.RuneSelf-1 {
		return fmt.Sprintf("%q (U+%04X)", r, r)
	}
	return fmt.Sprintf("U+%04X", r)
}

// checkIdentifier validates a tenant or company id: non-empty, valid
// UTF-8, at most max bytes, and only the characters of the allow-list
// IdentifierCharacters.
func checkIdentifier(field, value string, max int) error {
	switch {
	case value == "":
		return &ValidationError{field, "must not be empty"}
	case len(value) > max:
		return &ValidationError{field, fmt.Sprintf("must be at most %d bytes, got %d", max, len(value))}
	case !utf8.ValidString(value):
		return &ValidationError{field, "must be valid UTF-8"}
	}
	if why := checkAllowed(value, &identifierASCII, true, IdentifierCharacters); why != "" {
		return &ValidationError{field, why}
	}
	return nil
}

// CheckPathSegment checks one segment of a folder's path (between slashes,
// not empty) against the allow-list PathSegmentCharacters; folder.Canonicalize
// applies it to every segment. The segment must be valid UTF-8. The error
// says which character is refused and what is allowed.
func CheckPathSegment(segment string) error {
	if segment == "" {
		return errors.New("empty path segment")
	}
	if why := checkAllowed(segment, &segmentASCII, false, PathSegmentCharacters); why != "" {
		return errors.New(why)
	}
	return nil
}

// checkText validates a free-form text (a reason, a lease holder, a
// source scope): non-empty, valid UTF-8, no control characters or
// invisible formatting characters (IsInvisible), no whitespace at either
// end (by rune: U+2003 is whitespace, a full-width letter is not), at most
// max bytes.
func checkText(field, value string, max int) error {
	switch {
	case value == "":
		return &ValidationError{field, "must not be empty"}
	case len(value) > max:
		return &ValidationError{field, fmt.Sprintf("must be at most %d bytes, got %d", max, len(value))}
	case !utf8.ValidString(value):
		return &ValidationError{field, "must be valid UTF-8"}
	}
	for _, r := range value {
		if unicode.IsControl(r) {
			return &ValidationError{field, "must not contain control characters"}
		}
		if IsInvisible(r) {
			return &ValidationError{field, fmt.Sprintf("must not contain invisible formatting characters (U+%04X)", r)}
		}
	}
	first, _ := utf8.DecodeRuneInString(value)
	last, _ := utf8.DecodeLastRuneInString(value)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return &ValidationError{field, "must not start or end with whitespace"}
	}
	return nil
}

// checkDatabaseName validates a tenant database name: an unquoted SQL
// identifier of letters, digits, underscore, dollar and hyphen, starting with
// a letter or underscore.
func checkDatabaseName(field, value string) error {
	if err := checkText(field, value, MaxTenantDatabaseLen); err != nil {
		return err
	}
	for i, r := range value {
		ok := r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') ||
			(i > 0 && (r == '$' || r == '-' || (r >= '0' && r <= '9')))
		if !ok {
			return &ValidationError{field, "must start with a letter or underscore and contain only letters, digits, '_', '$' or '-'"}
		}
	}
	return nil
}

// ValidateTenantID checks a tenant id: at most MaxTenantIDLen bytes of the
// allow-list IdentifierCharacters. Every door reaches it (the
// reservation, resume, retry, cancel and the operator commands), and the
// worker applies it again to each batch row before reading a byte.
func ValidateTenantID(v string) error { return checkIdentifier("tenant_id", v, MaxTenantIDLen) }

// ValidateCompanyID checks a company (customer) id: at most
// MaxCompanyIDLen bytes of the allow-list IdentifierCharacters.
func ValidateCompanyID(v string) error { return checkIdentifier("company_id", v, MaxCompanyIDLen) }

// ValidateTenantDatabase checks a tenant database name.
func ValidateTenantDatabase(v string) error { return checkDatabaseName("tenant_database", v) }

// ValidateSourceScope checks a source scope.
func ValidateSourceScope(v string) error { return checkText("source_scope", v, MaxSourceScopeLen) }

// ValidateLeaseID checks an execution lease holder id.
func ValidateLeaseID(v string) error { return checkText("lease_id", v, MaxLeaseIDLen) }

func validSourceType(t SourceType) bool {
	for _, known := range SourceTypes {
		if t == known {
			return true
		}
	}
	return false
}

func validIngestionMode(m IngestionMode) bool {
	for _, known := range IngestionModes {
		if m == known {
			return true
		}
	}
	return false
}
