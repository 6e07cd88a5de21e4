package folder

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Values a warehouse refuses.
//
// JSON allows values the warehouse cannot store: PostgreSQL's jsonb holds
// numbers as numeric, which has bounds, and text, which holds neither NUL
// nor invalid UTF-8 nor a lone UTF-16 surrogate. Such a value met by the
// warehouse's COPY fails the whole load, whatever the import's tolerance,
// so the reader refuses it first: the record is a *BadRecord naming the
// object, the line, the column where the value starts and the value's JSON
// path, skipped within the tolerance like any other.
//
// What a number may be (numeric_in and make_result of PostgreSQL 15 and
// later, which jsonb parses numbers with, and TestNDJSONNumbersMatchWhatJSONBStores):
//   - its exponent within ±(2³⁰−1), exclusive, whatever the digits (0e1073741823
//     is refused);
//   - at most 16383 digits after the decimal point once the exponent is
//     applied (1e-16383 is stored, 1.0e-16383 is not: written zeros count);
//   - its first non-zero digit at most 10^131071 (131072 digits before the
//     point). Zero has no first digit and is stored whatever its exponent.
//
// Checking costs a pass over the record beside json.Valid's, and parses
// only the numbers that may be out of range: those written with an
// exponent or at least longNumber bytes long. Every other number is within
// numeric and DOUBLE PRECISION (a RefuseNumber is never asked about it).

// longNumber is the length from which a number without an exponent may be
// out of DOUBLE PRECISION's range (at most 299 digits before the point is
// below 1e299; a first non-zero digit within 298 places after it is above
// 1e-299): shorter ones are never parsed.
const longNumber = 300

// Limits of PostgreSQL's numeric.
const (
	// numericMaxExponent is the magnitude of an exponent numeric_in
	// refuses whatever the digits (INT_MAX/2).
	numericMaxExponent = 1<<30 - 1
	// numericMaxScale is the most digits after the decimal point
	// (NUMERIC_DSCALE_MAX).
	numericMaxScale = 16383
	// numericMaxIntegerDigits is the most digits before the decimal point:
	// the first digit's weight in base 10,000 is an int16.
	numericMaxIntegerDigits = 131072
)

// RefuseNumber is a warehouse's own bound on JSON numbers, narrower than
// PostgreSQL numeric's: it returns why the warehouse cannot store number
// (a valid JSON number token, such as 1e400), or "" when it can. The
// reader asks it only about numbers written with an exponent or at least
// 300 bytes long, after numeric's own bounds: the others are within
// DOUBLE PRECISION's range, so it can refuse what lies beyond DOUBLE
// PRECISION, not a narrower type.
type RefuseNumber func(number []byte) string

// RefuseNumbers makes r refuse, as bad records, the NDJSON numbers refuse
// gives a reason for, beside those numeric cannot hold. Call it before the
// first Next.
func (r *RecordReader) RefuseNumbers(refuse RefuseNumber) { r.refuse = refuse }

// unstorable is a value of a record that cannot be stored: the offset in
// the record of a byte of it, and why.
type unstorable struct {
	at  int
	why string
}

// checkValues returns the first value of b, a valid JSON text, that the
// warehouse cannot store (by its offset in b), or false when every value
// can be stored: a string holding invalid UTF-8, \u0000 or a lone
// surrogate escape, a number beyond numeric, or one refuse refuses.
func checkValues(b []byte, refuse RefuseNumber) (unstorable, bool) {
	first := unstorable{at: len(b)}
	found := false
	keep := func(u unstorable) {
		if u.at < first.at {
			first, found = u, true
		}
	}
	if !utf8.Valid(b) {
		keep(invalidUTF8(b))
	}
	if u, ok := unstorableEscape(b); ok {
		keep(u)
	}
	if u, ok := unstorableNumber(b, refuse); ok {
		keep(u)
	}
	return first, found
}

// invalidUTF8 locates the first invalid UTF-8 sequence of b, which is not
// valid UTF-8. JSON allows bytes over 0x7f only inside strings.
func invalidUTF8(b []byte) unstorable {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return unstorable{at: i, why: "invalid UTF-8 cannot be stored"}
		}
		i += size
	}
	return unstorable{at: len(b)}
}

// unstorableEscape locates the first escape of the valid JSON text b that
// PostgreSQL's jsonb cannot store. JSON itself allows every \uXXXX
// escape, but jsonb refuses \u0000 (it cannot hold NUL: "unsupported
// Unicode escape sequence") and UTF-16 surrogate escapes that are not a
// high-low pair. Only real escapes count: the six characters \u0000
// written as the JSON string "\\u0000" decode to a backslash and "u0000",
// which are stored as they are. A raw NUL byte never reaches here: JSON
// refuses raw control characters in strings.
func unstorableEscape(b []byte) (unstorable, bool) {
	for off := 0; ; {
		i := bytes.IndexByte(b[off:], '\\')
		if i < 0 {
			return unstorable{}, false
		}
		i += off
		// b is valid JSON, so a backslash starts an escape inside a string
		// and \u is followed by four hex digits.
		if b[i+1] != 'u' {
			off = i + 2
			continue
		}
		r := hex4(b[i+2 : i+6])
		off = i + 6
		switch {
		case r == 0:
			return unstorable{at: i, why: `NUL characters (\u0000) cannot be stored`}, true
		case r >= 0xD800 && r < 0xDC00:
			if len(b) >= off+6 && b[off] == '\\' && b[off+1] == 'u' {
				if lo := hex4(b[off+2 : off+6]); lo >= 0xDC00 && lo < 0xE000 {
					off += 6
					continue
				}
			}
			return unstorable{at: i, why: "an unpaired UTF-16 surrogate escape cannot be stored"}, true
		case r >= 0xDC00 && r < 0xE000:
			return unstorable{at: i, why: "an unpaired UTF-16 surrogate escape cannot be stored"}, true
		}
	}
}

// unstorableNumber locates the first number of the valid JSON text b that
// numeric cannot hold or refuse refuses. A record shorter than longNumber
// without an exponent (an e between a digit and a digit or sign, in a
// string or not) holds no number that may be out of range, and is not
// scanned. Otherwise strings are skipped by their closing quote (one an
// even run of backslashes precedes), and numbers are parsed only when
// written with an exponent or at least longNumber bytes long.
func unstorableNumber(b []byte, refuse RefuseNumber) (unstorable, bool) {
	if len(b) < longNumber && !mayHoldExponent(b, 'e') && !mayHoldExponent(b, 'E') {
		return unstorable{}, false
	}
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '"':
			j := i + 1
			for {
				q := bytes.IndexByte(b[j:], '"')
				if q < 0 { // not valid JSON: nothing more to check
					return unstorable{}, false
				}
				q += j
				n := 0
				for p := q - 1; b[p] == '\\'; p-- {
					n++
				}
				j = q + 1
				if n%2 == 0 {
					break
				}
			}
			i = j
		case c == '-' || c >= '0' && c <= '9':
			j, exp := i+1, false
			for ; j < len(b); j++ {
				c := b[j]
				if c >= '0' && c <= '9' || c == '.' || c == '-' || c == '+' {
					continue
				}
				if c == 'e' || c == 'E' {
					exp = true
					continue
				}
				break
			}
			if exp || j-i >= longNumber {
				why := numericRefusal(b[i:j])
				if why == "" && refuse != nil {
					why = refuse(b[i:j])
				}
				if why != "" {
					return unstorable{at: i, why: why}, true
				}
			}
			i = j
		default:
			i++
		}
	}
	return unstorable{}, false
}

// mayHoldExponent reports whether b holds e (e or E) between a digit and
// a digit or sign, as an exponent is written.
func mayHoldExponent(b []byte, e byte) bool {
	for off := 1; off < len(b); {
		i := bytes.IndexByte(b[off:], e)
		if i < 0 {
			return false
		}
		i += off
		if i+1 < len(b) && isDigit(b[i-1]) && (isDigit(b[i+1]) || b[i+1] == '-' || b[i+1] == '+') {
			return true
		}
		off = i + 1
	}
	return false
}

// numericRefusal returns why PostgreSQL's numeric cannot hold the valid
// JSON number tok, or "" when it can (see the bounds above).
func numericRefusal(tok []byte) string {
	i := 0
	if tok[i] == '-' {
		i++
	}
	start := i
	for i < len(tok) && isDigit(tok[i]) {
		i++
	}
	integer := tok[start:i]
	var fraction []byte
	if i < len(tok) && tok[i] == '.' {
		i++
		start = i
		for i < len(tok) && isDigit(tok[i]) {
			i++
		}
		fraction = tok[start:i]
	}
	var exp int64
	if i < len(tok) && (tok[i] == 'e' || tok[i] == 'E') {
		i++
		neg := false
		if tok[i] == '+' || tok[i] == '-' {
			neg = tok[i] == '-'
			i++
		}
		for ; i < len(tok) && exp < numericMaxExponent; i++ {
			exp = exp*10 + int64(tok[i]-'0')
		}
		if exp >= numericMaxExponent {
			return fmt.Sprintf("the number has an exponent beyond ±%d, which PostgreSQL's numeric cannot take", numericMaxExponent-1)
		}
		if neg {
			exp = -exp
		}
	}
	if scale := int64(len(fraction)) - exp; scale > numericMaxScale {
		return fmt.Sprintf("the number has %d digits after the decimal point, more than the %d PostgreSQL's numeric holds", scale, numericMaxScale)
	}
	// The power of ten of the first non-zero digit.
	var first int64
	if k := firstNonZero(integer); k >= 0 {
		first = int64(len(integer)-1-k) + exp
	} else if k := firstNonZero(fraction); k >= 0 {
		first = -int64(k+1) + exp
	} else {
		return "" // zero
	}
	if first >= numericMaxIntegerDigits {
		return fmt.Sprintf("the number has %d digits before the decimal point, more than the %d PostgreSQL's numeric holds", first+1, numericMaxIntegerDigits)
	}
	return ""
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// firstNonZero returns the index of the first digit of digits that is not
// 0, or -1.
func firstNonZero(digits []byte) int {
	for i, c := range digits {
		if c != '0' {
			return i
		}
	}
	return -1
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		}
	}
	return r
}

// maxNesting is the deepest nesting encoding/json parses, and so the
// reader (PostgreSQL's jsonb stores 10,000 levels with its default
// max_stack_depth of 2 MB).
const maxNesting = 10_000

// notAnObject returns the reason an NDJSON line json.Valid refuses is a
// bad record: "not a JSON object", and why when it is one nested deeper
// than maxNesting.
func notAnObject(b []byte) string {
	const why = "not a JSON object"
	if b[0] != '{' {
		return why
	}
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			i = stringEnd(b, i) - 1
		case '{', '[':
			if depth++; depth > maxNesting {
				return fmt.Sprintf("%s: nested more than %d levels deep", why, maxNesting)
			}
		case '}', ']':
			depth--
		}
	}
	return why
}

// badValue returns the bad record of the NDJSON line raw (whose trimmed
// record is b, valid JSON) for its unstorable value u: the column is the
// 1-based byte where the value starts in the line, the reason names its
// JSON path, and the excerpt is the value itself.
func (r *RecordReader) badValue(raw, b []byte, u unstorable) *BadRecord {
	lead := len(raw) - len(bytes.TrimLeftFunc(raw, unicode.IsSpace))
	loc := locate(b, u.at)
	what := "the value at " + loc.path
	if loc.key {
		what = "a key of " + loc.path
	}
	return &BadRecord{ObjectKey: r.key, Line: r.line, Column: lead + loc.start + 1,
		Reason: what + ": " + u.why, Excerpt: Excerpt(b[loc.start:loc.end])}
}

// location is where a byte of a JSON text is: the JSON path of the value
// holding it, the bounds of its token (a string, a key, a number or a
// literal), and whether that token is an object's key.
type location struct {
	path       string
	start, end int
	key        bool
}

// maxPathBytes bounds the JSON path a reason names; a longer one is cut
// with "…".
const maxPathBytes = 256

// locate returns where byte off of the valid JSON text b is. It is for
// reasons only: it walks b from its start, keeping the path.
func locate(b []byte, off int) location {
	type frame struct {
		object    bool
		expectKey bool
		key       []byte // the key of the current member, JSON-quoted
		index     int
	}
	var stack []frame
	path := func(key bool) string {
		var sb strings.Builder
		sb.WriteByte('$')
		for i, f := range stack {
			switch {
			case sb.Len() > maxPathBytes:
			case !f.object:
				fmt.Fprintf(&sb, "[%d]", f.index)
			case f.key != nil && !(key && i == len(stack)-1):
				writeKey(&sb, f.key)
			}
		}
		return cutUTF8(sb.String(), maxPathBytes)
	}
	for i := 0; i < len(b); {
		switch c := b[i]; c {
		case '{', '[':
			stack = append(stack, frame{object: c == '{', expectKey: c == '{'})
			i++
		case '}', ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			i++
		case ',':
			if n := len(stack); n > 0 {
				if stack[n-1].object {
					stack[n-1].expectKey = true
				} else {
					stack[n-1].index++
				}
			}
			i++
		case '"':
			end := stringEnd(b, i)
			key := len(stack) > 0 && stack[len(stack)-1].object && stack[len(stack)-1].expectKey
			if off >= i && off < end {
				return location{path: path(key), start: i, end: end, key: key}
			}
			if key {
				f := &stack[len(stack)-1]
				f.key, f.expectKey = b[i:end], false
			}
			i = end
		case ':', ' ', '\t', '\r', '\n':
			i++
		default: // a number or a literal
			j := i + 1
			for j < len(b) && !isDelimiter(b[j]) {
				j++
			}
			if off >= i && off < j {
				return location{path: path(false), start: i, end: j}
			}
			i = j
		}
	}
	return location{path: "$", start: 0, end: len(b)}
}

func isDelimiter(c byte) bool {
	switch c {
	case ',', ']', '}', ':', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

// cutUTF8 cuts s to at most n bytes at a character boundary, marking a cut
// with "…".
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// stringEnd returns the index just past the string starting at b[i].
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// writeKey writes the JSON-quoted key as a path step: .name for a key of
// letters, digits and underscores not starting with a digit, ["…"]
// otherwise; a key is cut at 64 bytes.
func writeKey(sb *strings.Builder, quoted []byte) {
	var k string
	if err := json.Unmarshal(quoted, &k); err != nil {
		k = string(quoted[1 : len(quoted)-1])
	}
	k = cutUTF8(k, 64)
	plain := k != "" && !isDigit(k[0])
	for _, c := range []byte(k) {
		if !(c == '_' || isDigit(c) || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			plain = false
			break
		}
	}
	if plain {
		sb.WriteString("." + k)
		return
	}
	sb.WriteString("[" + strconv.Quote(k) + "]")
}
