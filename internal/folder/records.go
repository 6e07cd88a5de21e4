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
	"math"
	"strconv"
	"strings"
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
	// JSON is the record as a JSON object, valid UTF-8 holding only values
	// PostgreSQL's jsonb stores (and none RefuseNumbers refuses). It is
	// only valid until the next call to Next.
	JSON []byte
}

// ErrMalformed is wrapped by every error about bad data in an object. Such
// errors are never transient.
var ErrMalformed = errors.New("malformed record")

// Defaults of Limits.
const (
	// MaxRecordBytesDefault bounds one NDJSON line or CSV record, line
	// terminator included.
	MaxRecordBytesDefault = 16 << 20
	// MaxColumnsDefault bounds the columns of a CSV object.
	MaxColumnsDefault = 4096
	// MaxRecordExpansionDefault bounds how many times its CSV bytes a CSV
	// record (and a CSV object's records together) may become as JSON,
	// beyond RecordExpansionAllowance. Ordinary fleet CSVs reach 2× to 13×
	// (short column names, many empty optional fields; 19× with 30-byte
	// names over one-digit values); the red team's 1 MiB header over 200
	// nearly empty rows reached 261× per record and 114× per object.
	MaxRecordExpansionDefault = 32
	// RecordExpansionAllowance is the fixed number of JSON bytes a CSV
	// record, and a CSV object's records together, may take beyond
	// MaxRecordExpansion times their CSV bytes: room for long column names
	// over short rows (a one-column CSV with a 100-byte name and one-digit
	// values is 54× its rows) without room for an amplifying header: it is
	// counted once per record and once per object, not once per column.
	RecordExpansionAllowance = 4 << 10
)

// Limits bound what one record may cost to read, so that a hostile or
// broken object fails its batch (failed_pre_commit, naming the object and
// line) instead of exhausting the worker's memory: encoding/csv and
// bufio.Scanner hold a whole record in memory, several times over.
type Limits struct {
	// MaxRecordBytes bounds one NDJSON line or one CSV record (which may
	// span lines inside quotes), line terminator included. Defaults to
	// MaxRecordBytesDefault (16 MiB).
	MaxRecordBytes int
	// MaxColumns bounds the fields of one CSV record, the header included.
	// Defaults to MaxColumnsDefault.
	MaxColumns int
	// MaxRecordExpansion bounds what a CSV object costs to store against
	// what it cost to upload. Every record repeats the header's column
	// names, so a wide header over nearly empty rows (1 MiB of names, 200
	// rows of commas) became 116 times its size in the warehouse. The JSON
	// of a CSV record may be at most MaxRecordExpansion times the record's
	// CSV bytes (line terminator included) plus RecordExpansionAllowance;
	// the JSON of an object's records together at most MaxRecordExpansion
	// times the object's bytes read so far (header included) plus
	// RecordExpansionAllowance, which stops the allowance from adding up
	// over many tiny rows. NDJSON records are stored as they are given, so
	// they are not bounded by it. Defaults to MaxRecordExpansionDefault.
	MaxRecordExpansion int
}

func (l Limits) withDefaults() Limits {
	if l.MaxRecordBytes <= 0 {
		l.MaxRecordBytes = MaxRecordBytesDefault
	}
	if l.MaxColumns <= 0 {
		l.MaxColumns = MaxColumnsDefault
	}
	if l.MaxRecordExpansion <= 0 {
		l.MaxRecordExpansion = MaxRecordExpansionDefault
	}
	return l
}

// expanded returns the most JSON bytes that inputBytes of CSV may become:
// MaxRecordExpansion × inputBytes + RecordExpansionAllowance, saturating.
func (l Limits) expanded(inputBytes int64) int64 {
	n := int64(l.MaxRecordExpansion)
	if inputBytes > (math.MaxInt64-RecordExpansionAllowance)/n {
		return math.MaxInt64
	}
	return n*inputBytes + RecordExpansionAllowance
}

// RecordReader streams the records of a list of objects, one object open at a
// time, so memory does not grow with the folder's size.
type RecordReader struct {
	ctx     context.Context
	src     *Source
	limits  Limits
	objects []Object
	next    int

	cur    io.ReadCloser
	key    string
	csv    *csv.Reader
	guard  *csvGuard
	header [][]byte // JSON-encoded header names, with trailing ':'
	names  []string // the header names, for reasons
	csvEnd int64    // input offset of the end of the last CSV record read
	json   int64    // JSON bytes of the current CSV object's records
	lines  *bufio.Scanner
	line   int64
	// in buffers the object being read; kept for the next object when
	// large enough for it.
	in *bufio.Reader

	rec   Record
	buf   []byte
	err   error
	count int64

	// maxBad is how many bad records the reader skips (Source.Tolerate);
	// bad holds those it skipped.
	maxBad int
	bad    []BadRecord

	// refuse is the warehouse's own bound on numbers (RefuseNumbers).
	refuse RefuseNumber
}

// Records returns a reader over the records of objects, in order.
//
// A record that cannot be stored (a CSV row with another number of fields
// than the header, or a quote out of place; a value that is not valid
// UTF-8 or holds NUL, its reason naming the header's column; an NDJSON
// line that is not a JSON object, or holds a value the warehouse refuses:
// invalid UTF-8, an escape jsonb refuses, a number beyond PostgreSQL's
// numeric or one RefuseNumbers refuses, its column the byte where the
// value starts and its reason the value's JSON path, see values.go) is a
// *BadRecord. The reader skips up to the
// Source's tolerance of them (Tolerate; Bad lists them) and fails on the
// next with a *TooManyBadRecordsError; with no tolerance, the first fails
// the read. Whatever makes the rest of an object unreadable (no header, a
// record over Limits, the object's JSON over its expansion bound, a read
// error) fails the read whatever the tolerance.
func (s *Source) Records(ctx context.Context, objects []Object) *RecordReader {
	return &RecordReader{ctx: ctx, src: s, limits: s.limits.withDefaults(), objects: objects, maxBad: s.maxBad}
}

// Tolerate sets how many bad records the readers of s skip (Records), at
// most MaxBadRecordsCap; 0, the default, fails at the first.
func (s *Source) Tolerate(n int) { s.maxBad = min(max(n, 0), MaxBadRecordsCap) }

// Bad returns the bad records the reader skipped, in order.
func (r *RecordReader) Bad() []BadRecord { return r.bad }

// skip records b as skipped, or returns the error that ends the read when
// the tolerance is used up.
func (r *RecordReader) skip(b *BadRecord) error {
	if len(r.bad) >= r.maxBad {
		return &TooManyBadRecordsError{Bad: b, Tolerated: len(r.bad)}
	}
	r.bad = append(r.bad, *b)
	return nil
}

// Reject reports the record the reader just returned as bad: one the
// warehouse cannot store for a reason the reader does not check (such as
// Redshift's limits on a SUPER value). It counts against the same
// tolerance as the reader's own: nil means the caller skips the record
// (Bad lists it); otherwise the *TooManyBadRecordsError ends the read, and
// Err returns it too.
func (r *RecordReader) Reject(b *BadRecord) error {
	if err := r.skip(b); err != nil {
		r.err = err
		return err
	}
	return nil
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

// readBufferSize is the read buffer for an object of size bytes: 256 KiB,
// or less for a smaller object (at least 4 KiB). A folder of many small
// objects allocated 256 KiB for each, most of a trivial load's garbage.
func readBufferSize(size int64) int {
	return int(min(max(size+1, 4<<10), 256<<10))
}

// buffered returns r's read buffer reading src, allocated for an object of
// size bytes unless the buffer of an earlier object is large enough.
func (r *RecordReader) buffered(src io.Reader, size int64) *bufio.Reader {
	if want := readBufferSize(size); r.in == nil || r.in.Size() < want {
		r.in = bufio.NewReaderSize(src, want)
	} else {
		r.in.Reset(src)
	}
	return r.in
}

func (r *RecordReader) open(o Object) error {
	rc, err := r.src.bucket.NewReader(r.ctx, o.Key, nil)
	if err != nil {
		return fmt.Errorf("opening %s: %w", r.src.FullKey(o), err)
	}
	r.cur, r.key, r.line = rc, r.src.FullKey(o), 0
	switch o.Format {
	case FormatCSV:
		// The guard sees the bytes before encoding/csv buffers them, so an
		// oversized record is refused after at most MaxRecordBytes of it.
		r.guard = &csvGuard{r: rc, maxBytes: int64(r.limits.MaxRecordBytes), maxFields: r.limits.MaxColumns, line: 1}
		r.csv = csv.NewReader(r.buffered(r.guard, o.Size))
		r.csv.ReuseRecord = true
		header, err := r.csv.Read()
		if err == io.EOF {
			return fmt.Errorf("%w: %s: no header row", ErrMalformed, r.key)
		}
		if err != nil {
			return r.csvError(err)
		}
		r.header, r.names = r.header[:0], r.names[:0]
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
			r.names = append(r.names, h)
		}
		r.csvEnd, r.json = r.csv.InputOffset(), 0
	case FormatNDJSON:
		r.lines = bufio.NewScanner(r.buffered(rc, o.Size))
		r.lines.Buffer(make([]byte, 0, min(64<<10, r.limits.MaxRecordBytes, readBufferSize(o.Size))), r.limits.MaxRecordBytes)
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
	r.cur, r.csv, r.guard, r.lines = nil, nil, nil, nil
	if err != nil {
		return fmt.Errorf("closing %s: %w", r.key, err)
	}
	return nil
}

func (r *RecordReader) csvError(err error) error {
	var tooBig *recordTooLargeError
	if errors.As(err, &tooBig) {
		return fmt.Errorf("%w: %s: line %d: %s", ErrMalformed, r.key, tooBig.line, tooBig.what)
	}
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
		for {
			ok, bad, err := r.readCSV()
			if bad != nil {
				if err := r.skip(bad); err != nil {
					return false, err
				}
				continue
			}
			return ok, err
		}
	}
	for r.lines.Scan() {
		r.line++
		raw := r.lines.Bytes()
		b := bytes.TrimSpace(raw)
		if len(b) == 0 {
			continue
		}
		var bad *BadRecord
		if b[0] != '{' || !jsonValid(b) {
			bad = &BadRecord{ObjectKey: r.key, Line: r.line, Reason: notAnObject(b), Excerpt: Excerpt(b)}
		} else if u, found := checkValues(b, r.refuse); found {
			bad = r.badValue(raw, b, u)
		}
		if bad != nil {
			if err := r.skip(bad); err != nil {
				return false, err
			}
			continue
		}
		r.rec = Record{ObjectKey: r.key, Line: r.line, JSON: b}
		return true, nil
	}
	if err := r.lines.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return false, fmt.Errorf("%w: %s: line %d longer than %d bytes", ErrMalformed, r.key, r.line+1, r.limits.MaxRecordBytes)
		}
		return false, fmt.Errorf("reading %s: %w", r.key, err)
	}
	return false, nil
}

// readCSV reads the next CSV record of the current object: false at its
// end; bad (with a nil error) for a record that cannot be stored, which the
// caller may skip.
func (r *RecordReader) readCSV() (ok bool, bad *BadRecord, err error) {
	row, err := r.csv.Read()
	if err == io.EOF {
		return false, nil, nil
	}
	var perr *csv.ParseError
	if errors.As(err, &perr) && !errors.As(err, new(*recordTooLargeError)) {
		// encoding/csv goes on with the next record after a parse error.
		b := &BadRecord{ObjectKey: r.key, Line: int64(perr.StartLine), Reason: perr.Err.Error()}
		if errors.Is(perr.Err, csv.ErrFieldCount) {
			b.Reason = fmt.Sprintf("%d fields, the header has %d", len(row), len(r.header))
			b.Excerpt = Excerpt([]byte(joinCSV(row)))
		} else {
			b.Column = perr.Column
		}
		r.csvEnd = r.csv.InputOffset()
		return false, b, nil
	}
	if err != nil {
		return false, nil, r.csvError(err)
	}
	line, _ := r.csv.FieldPos(0)
	end := r.csv.InputOffset()
	rowBytes := end - r.csvEnd
	r.csvEnd = end
	// The bound is checked column by column, so an amplifying record is
	// refused before its JSON is built whole.
	maxJSON := r.limits.expanded(rowBytes)
	buf := append(r.buf[:0], '{')
	for i, v := range row {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, r.header[i]...)
		if buf, err = appendJSONString(buf, v); err != nil {
			r.buf = buf[:0]
			return false, &BadRecord{ObjectKey: r.key, Line: int64(line), Column: i + 1,
				Reason: "column " + strconv.Quote(r.names[i]) + ": " + err.Error(), Excerpt: Excerpt([]byte(v))}, nil
		}
		if int64(len(buf))+1 > maxJSON {
			return false, nil, fmt.Errorf("%w: %s: line %d: %d bytes of CSV become more than %d bytes of JSON (at most %d× plus %d bytes: the header's column names are repeated in every record)",
				ErrMalformed, r.key, line, rowBytes, maxJSON, r.limits.MaxRecordExpansion, RecordExpansionAllowance)
		}
	}
	r.buf = append(buf, '}')
	r.json += int64(len(r.buf))
	if maxObject := r.limits.expanded(end); r.json > maxObject {
		return false, nil, fmt.Errorf("%w: %s: line %d: the object's first %d bytes of CSV become %d bytes of JSON, more than %d× plus %d bytes (the header's column names are repeated in every record)",
			ErrMalformed, r.key, line, end, r.json, r.limits.MaxRecordExpansion, RecordExpansionAllowance)
	}
	r.rec = Record{ObjectKey: r.key, Line: int64(line), JSON: r.buf}
	return true, nil, nil
}

// joinCSV writes a row back as one CSV line, for an excerpt.
func joinCSV(row []string) string {
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	_ = w.Write(row)
	w.Flush()
	return strings.TrimSuffix(b.String(), "\n")
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

// recordTooLargeError is a CSV record over a Limits bound.
type recordTooLargeError struct {
	line int64
	what string
}

func (e *recordTooLargeError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.what) }

// csvGuard passes a CSV object through to encoding/csv and fails the read,
// before csv has buffered more than maxBytes of it, at the first record
// longer than maxBytes or with more than maxFields fields. It follows
// quoting as RFC 4180 does: every quote toggles quoting (a doubled quote
// toggles twice), and a newline outside quotes ends a record. A quote inside
// an unquoted field is a csv parse error, which csv reports first: the guard
// runs ahead of csv by at most its read buffer.
type csvGuard struct {
	r         io.Reader
	maxBytes  int64
	maxFields int

	line     int64 // the line being read, from 1
	recLine  int64 // the line where the current record starts
	recBytes int64
	fields   int
	quoted   bool
	err      error
}

func (g *csvGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(p)
	for i, c := range p[:n] {
		if g.recBytes == 0 {
			g.recLine, g.fields = g.line, 1
		}
		g.recBytes++
		switch c {
		case '"':
			g.quoted = !g.quoted
		case ',':
			if !g.quoted {
				g.fields++
			}
		case '\n':
			g.line++
		}
		switch {
		case g.recBytes > g.maxBytes:
			g.err = &recordTooLargeError{line: g.recLine, what: fmt.Sprintf("record longer than %d bytes", g.maxBytes)}
		case g.fields > g.maxFields:
			g.err = &recordTooLargeError{line: g.recLine, what: fmt.Sprintf("more than %d columns", g.maxFields)}
		}
		if g.err != nil {
			return i, g.err
		}
		if c == '\n' && !g.quoted {
			g.recBytes = 0
		}
	}
	return n, err
}
