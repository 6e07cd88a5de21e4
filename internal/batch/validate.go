package batch

import (
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
// character: Unicode format characters (bidirectional overrides and
// isolates, zero-width spaces and joiners, the byte order mark, …) and the
// line and paragraph separators. A name holding one can look like another
// name, so identifiers and folders refuse them.
func IsInvisible(r rune) bool {
	if r < utf8.RuneSelf {
		// No ASCII character is one, and identifiers and folder paths are
		// mostly ASCII: the table look-up was a tenth of enqueue serve's
		// CPU per import.
		return false
	}
	return unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// checkText validates a free-form identifier: non-empty, valid UTF-8, no
// control characters or invisible formatting characters (IsInvisible), no
// whitespace at either end (by rune: U+2003 is whitespace, a full-width
// letter is not), at most max bytes.
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

// ValidateTenantID checks a tenant id.
func ValidateTenantID(v string) error { return checkText("tenant_id", v, MaxTenantIDLen) }

// ValidateCompanyID checks a company (customer) id.
func ValidateCompanyID(v string) error { return checkText("company_id", v, MaxCompanyIDLen) }

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
