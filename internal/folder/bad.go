package folder

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// MaxExcerptBytes bounds the excerpt of a bad record's raw value: never a
// whole line of megabytes.
const MaxExcerptBytes = 1 << 10

// MaxBadRecordsCap is the most bad records an import may tolerate
// (Source.Tolerate): the skipped records are held, excerpts and all, until
// the load writes them with its slice.
const MaxBadRecordsCap = 10_000

// BadRecord is a record the reader refuses, reported as COPY's load errors
// are: the object, the line where the record starts, the column (1-based:
// a CSV record's field, or the byte of an NDJSON line where a value the
// warehouse refuses starts; 0 when the record as a whole is refused, such
// as an NDJSON line that is not a JSON object), the reason, and an excerpt
// of the raw value (escaped, at most MaxExcerptBytes of it). It is an
// error matching ErrMalformed.
type BadRecord struct {
	ObjectKey string
	Line      int64
	Column    int
	Reason    string
	Excerpt   string
}

// Error names the record, the column, the reason and the excerpt.
func (b *BadRecord) Error() string {
	where := fmt.Sprintf("line %d", b.Line)
	if b.Column > 0 {
		where += fmt.Sprintf(", column %d", b.Column)
	}
	msg := fmt.Sprintf("%s: %s: %s: %s", ErrMalformed, b.ObjectKey, where, b.Reason)
	if b.Excerpt != "" {
		msg += " (value " + b.Excerpt + ")"
	}
	return msg
}

// Is makes errors.Is(err, ErrMalformed) true.
func (b *BadRecord) Is(target error) bool { return target == ErrMalformed }

// TooManyBadRecordsError is the error of a reader that met one bad record
// more than its tolerance: Bad is that record; Tolerated how many were
// skipped before it.
type TooManyBadRecordsError struct {
	Bad       *BadRecord
	Tolerated int
}

func (e *TooManyBadRecordsError) Error() string {
	if e.Tolerated == 0 {
		return e.Bad.Error()
	}
	return fmt.Sprintf("%d bad records, more than the %d tolerated: %v", e.Tolerated+1, e.Tolerated, e.Bad)
}

// Unwrap returns the bad record that was one too many.
func (e *TooManyBadRecordsError) Unwrap() error { return e.Bad }

// AsBadRecord returns the bad record err is or wraps.
func AsBadRecord(err error) (*BadRecord, bool) {
	var b *BadRecord
	ok := errors.As(err, &b)
	return b, ok
}

// Excerpt returns raw escaped as a Go string literal (control characters,
// invalid UTF-8 and quotes escaped), cut so the result holds at most
// MaxExcerptBytes; a cut excerpt ends with "…" and the raw length.
func Excerpt(raw []byte) string {
	if len(raw) == 0 {
		return `""`
	}
	const room = MaxExcerptBytes - 40 // the quotes, the ellipsis and the length
	out := make([]byte, 0, min(len(raw)*2, MaxExcerptBytes)+2)
	out = append(out, '"')
	cut := false
	for i := 0; i < len(raw); {
		r, size := utf8.DecodeRune(raw[i:])
		var piece []byte
		if r == utf8.RuneError && size == 1 {
			piece = fmt.Appendf(nil, `\x%02x`, raw[i])
		} else {
			piece = strconv.AppendQuoteRune(nil, r)
			piece = piece[1 : len(piece)-1] // without the single quotes
			switch r {
			case '\'':
				piece = []byte{'\''}
			case '"':
				piece = []byte{'\\', '"'}
			}
		}
		if len(out)+len(piece) > room {
			cut = true
			break
		}
		out = append(out, piece...)
		i += size
	}
	out = append(out, '"')
	if cut {
		out = fmt.Appendf(out, "… (%d bytes)", len(raw))
	}
	return string(out)
}
