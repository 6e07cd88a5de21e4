package folder

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Record is one data record: a CSV row turned into a JSON object keyed by the
// header, or one NDJSON object.
type Record struct {
	// ObjectKey is the full key of the object the record came from.
	ObjectKey string
	// Line is the 1-based line of the record in its object (for CSV, the line
	// where the row starts).
	Line int64
	// JSON is the record as a JSON object. It is only valid until the next
	// call to Next.
	JSON []byte
}

// ErrMalformed is wrapped by every error about bad data in an object. Such
// errors are never transient.
var ErrMalformed = errors.New("malformed record")

// MaxLineBytes bounds one NDJSON line or CSV row.
const MaxLineBytes = 16 << 20

// RecordReader streams the records of a list of objects, one object open at a
// time, so memory does not grow with the folder's size.
type RecordReader struct {
	ctx     context.Context
	src     *Source
	objects []Object
	next    int

	cur    io.ReadCloser
	key    string
	csv    *csv.Reader
	header [][]byte // JSON-encoded header names, with trailing ':'
	lines  *bufio.Scanner
	line   int64

	rec   Record
	buf   []byte
	err   error
	count int64
}

// Records returns a reader over the records of objects, in order.
func (s *Source) Records(ctx context.Context, objects []Object) *RecordReader {
	return &RecordReader{ctx: ctx, src: s, objects: objects}
}

// Next advances to the next record. It returns false at the end or on error;
// check Err.
func (r *RecordReader) Next() bool {
	if r.err != nil {
		return false
	}
	for {
		if r.cur == nil {
			if r.next >= len(r.objects) {
				return false
			}
			if err := r.open(r.objects[r.next]); err != nil {
				r.err = err
				return false
			}
			r.next++
		}
		ok, err := r.read()
		if err != nil {
			r.err = err
			r.closeCurrent()
			return false
		}
		if ok {
			r.count++
			r.src.progress.records.Add(1)
			return true
		}
		if err := r.closeCurrent(); err != nil {
			r.err = err
			return false
		}
		r.src.progress.objects.Add(1)
	}
}

// Record returns the current record.
func (r *RecordReader) Record() Record { return r.rec }

// Err returns the first error met, or nil.
func (r *RecordReader) Err() error { return r.err }

// Count returns how many records were read so far.
func (r *RecordReader) Count() int64 { return r.count }

// Close releases the open object, if any.
func (r *RecordReader) Close() error { return r.closeCurrent() }

func (r *RecordReader) open(o Object) error {
	rc, err := r.src.bucket.NewReader(r.ctx, o.Key, nil)
	if err != nil {
		return fmt.Errorf("opening %s: %w", r.src.FullKey(o), err)
	}
	r.cur, r.key, r.line = rc, r.src.FullKey(o), 0
	br := bufio.NewReaderSize(rc, 256<<10)
	switch o.Format {
	case FormatCSV:
		r.csv = csv.NewReader(br)
		r.csv.ReuseRecord = true
		header, err := r.csv.Read()
		if err == io.EOF {
			return fmt.Errorf("%w: %s: no header row", ErrMalformed, r.key)
		}
		if err != nil {
			return r.csvError(err)
		}
		r.header = r.header[:0]
		seen := map[string]bool{}
		for i, h := range header {
			if i == 0 {
				h = stripBOM(h)
			}
			if h == "" {
				return fmt.Errorf("%w: %s: header column %d is empty", ErrMalformed, r.key, i+1)
			}
			if seen[h] {
				return fmt.Errorf("%w: %s: header column %q repeated", ErrMalformed, r.key, h)
			}
			seen[h] = true
			enc, err := appendJSONString(nil, h)
			if err != nil {
				return fmt.Errorf("%w: %s: header column %d: %v", ErrMalformed, r.key, i+1, err)
			}
			r.header = append(r.header, append(enc, ':'))
		}
	case FormatNDJSON:
		r.lines = bufio.NewScanner(br)
		r.lines.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	}
	return nil
}

func stripBOM(s string) string {
	if len(s) >= 3 && s[:3] == "\xef\xbb\xbf" {
		return s[3:]
	}
	return s
}

func (r *RecordReader) closeCurrent() error {
	if r.cur == nil {
		return nil
	}
	err := r.cur.Close()
	r.cur, r.csv, r.lines = nil, nil, nil
	if err != nil {
		return fmt.Errorf("closing %s: %w", r.key, err)
	}
	return nil
}

func (r *RecordReader) csvError(err error) error {
	var perr *csv.ParseError
	if errors.As(err, &perr) {
		return fmt.Errorf("%w: %s: line %d: %v", ErrMalformed, r.key, perr.StartLine, perr.Err)
	}
	return fmt.Errorf("reading %s: %w", r.key, err)
}

// read reads the next record of the current object; false at its end.
func (r *RecordReader) read() (bool, error) {
	if err := r.ctx.Err(); err != nil {
		return false, err
	}
	if r.csv != nil {
		row, err := r.csv.Read()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, r.csvError(err)
		}
		line, _ := r.csv.FieldPos(0)
		buf := append(r.buf[:0], '{')
		for i, v := range row {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, r.header[i]...)
			if buf, err = appendJSONString(buf, v); err != nil {
				return false, fmt.Errorf("%w: %s: line %d, column %d: %v", ErrMalformed, r.key, line, i+1, err)
			}
		}
		r.buf = append(buf, '}')
		r.rec = Record{ObjectKey: r.key, Line: int64(line), JSON: r.buf}
		return true, nil
	}
	for r.lines.Scan() {
		r.line++
		b := bytes.TrimSpace(r.lines.Bytes())
		if len(b) == 0 {
			continue
		}
		if b[0] != '{' || !jsonValid(b) {
			return false, fmt.Errorf("%w: %s: line %d: not a JSON object", ErrMalformed, r.key, r.line)
		}
		if bytes.Contains(b, []byte(`\u0000`)) {
			return false, fmt.Errorf("%w: %s: line %d: NUL characters cannot be stored", ErrMalformed, r.key, r.line)
		}
		r.rec = Record{ObjectKey: r.key, Line: r.line, JSON: b}
		return true, nil
	}
	if err := r.lines.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return false, fmt.Errorf("%w: %s: line %d longer than %d bytes", ErrMalformed, r.key, r.line+1, MaxLineBytes)
		}
		return false, fmt.Errorf("reading %s: %w", r.key, err)
	}
	return false, nil
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. It refuses invalid UTF-8 and
// NUL characters, which PostgreSQL's jsonb cannot store.
func appendJSONString(buf []byte, s string) ([]byte, error) {
	buf = append(buf, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				return buf, errors.New("invalid UTF-8")
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		buf = append(buf, s[start:i]...)
		switch c {
		case 0:
			return buf, errors.New("NUL characters cannot be stored")
		case '"', '\\':
			buf = append(buf, '\\', c)
		case '\n':
			buf = append(buf, '\\', 'n')
		case '\r':
			buf = append(buf, '\\', 'r')
		case '\t':
			buf = append(buf, '\\', 't')
		default:
			buf = append(buf, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	buf = append(buf, s[start:]...)
	return append(buf, '"'), nil
}

// jsonValid reports whether b is one valid JSON value.
func jsonValid(b []byte) bool { return json.Valid(b) }
