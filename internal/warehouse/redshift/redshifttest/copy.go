package redshifttest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"github.com/jackc/pgx/v5"
	"github.com/klauspost/compress/gzip"
)

// Redshift's limits the double enforces in COPY.
const (
	// maxJSONObject is COPY's limit on one JSON object (4 MB).
	maxJSONObject = 4 << 20
	// maxSuperString is the default limit on a string inside SUPER.
	maxSuperString = 65_535
)

// runCopy runs a parsed COPY inside tx: it reads the manifest and every part
// it names from S3 and inserts the rows, mapping JSON keys to the listed
// columns as FORMAT JSON 'auto' does. It returns the number of rows loaded.
func (d *Double) runCopy(ctx context.Context, tx pgx.Tx, c copyStatement) (int64, error) {
	if c.role == "" {
		return 0, errors.New("ERROR: IAM_ROLE must name a role")
	}
	bucket, key, ok := splitS3(c.manifest)
	if !ok {
		return 0, fmt.Errorf("ERROR: invalid manifest URL %q", c.manifest)
	}
	body, err := d.getObject(ctx, bucket, key)
	if err != nil {
		return 0, fmt.Errorf("ERROR: Problem reading manifest file - %w", err)
	}
	var man struct {
		Entries []struct {
			URL       *string `json:"url"`
			Mandatory bool    `json:"mandatory"`
			Meta      *struct {
				ContentLength *int64 `json:"content_length"`
			} `json:"meta"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(body, &man); err != nil {
		return 0, fmt.Errorf("ERROR: Manifest file is not in correct json format: %v", err)
	}
	types, err := columnTypes(ctx, tx, c.table, c.columns)
	if err != nil {
		return 0, err
	}
	var loaded int64
	files := 0
	for _, e := range man.Entries {
		if e.URL == nil {
			return 0, errors.New("ERROR: Manifest entry without url")
		}
		pb, pk, ok := splitS3(*e.URL)
		if !ok || strings.HasSuffix(pk, "/") {
			return 0, fmt.Errorf("ERROR: Manifest entry url %q is not an S3 object", *e.URL)
		}
		part, err := d.getObject(ctx, pb, pk)
		var apiErr smithy.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode() == "NoSuchKey" && !e.Mandatory {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("ERROR: S3ServiceException: reading mandatory file %s: %w", *e.URL, err)
		}
		if e.Meta != nil && e.Meta.ContentLength != nil && *e.Meta.ContentLength != int64(len(part)) {
			return 0, fmt.Errorf("ERROR: Manifest entry %s says content_length %d, the object has %d bytes", *e.URL, *e.Meta.ContentLength, len(part))
		}
		files++
		n, err := copyPart(ctx, tx, c, types, *e.URL, part)
		if err != nil {
			return 0, err
		}
		loaded += n
	}
	if files == 0 {
		return 0, errors.New("ERROR: Load into table failed: the manifest names no file that exists")
	}
	return loaded, nil
}

func splitS3(u string) (bucket, key string, ok bool) {
	rest, ok := strings.CutPrefix(u, "s3://")
	if !ok {
		return "", "", false
	}
	bucket, key, ok = strings.Cut(rest, "/")
	return bucket, key, ok && bucket != "" && key != ""
}

func (d *Double) getObject(ctx context.Context, bucket, key string) ([]byte, error) {
	out, err := d.opts.S3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		return nil, err
	}
	defer out.Body.Close()
	return io.ReadAll(out.Body)
}

// columnTypes returns the PostgreSQL type names of the listed columns.
func columnTypes(ctx context.Context, tx pgx.Tx, table string, cols []string) ([]string, error) {
	out := make([]string, len(cols))
	for i, c := range cols {
		err := tx.QueryRow(ctx, `
			SELECT format_type(a.atttypid, NULL) FROM pg_attribute a
			WHERE a.attrelid = $1::regclass AND a.attname = $2 AND NOT a.attisdropped`, table, c).Scan(&out[i])
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("ERROR: column %q of relation %q does not exist", c, table)
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// copyPart loads one gzip NDJSON part.
func copyPart(ctx context.Context, tx pgx.Tx, c copyStatement, types []string, url string, data []byte) (int64, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return 0, fmt.Errorf("ERROR: gzip: %s is not a gzip file: %v", url, err)
	}
	src := &jsonRows{sc: bufio.NewScanner(zr), cols: c.columns, types: types, url: url}
	src.sc.Buffer(make([]byte, 0, 64<<10), maxJSONObject+1)
	schema, table, _ := strings.Cut(c.table, ".")
	n, err := tx.CopyFrom(ctx, pgx.Identifier{schema, table}, c.columns, src)
	if src.err != nil {
		return 0, src.err
	}
	if err != nil {
		return 0, fmt.Errorf("ERROR: Load into table '%s' failed: %v", table, err)
	}
	return n, nil
}

// jsonRows turns NDJSON lines into rows, as FORMAT JSON 'auto' maps
// top-level keys to columns (case-sensitive: keys are lower-case column
// names; unknown keys are ignored, absent ones load NULL).
type jsonRows struct {
	sc    *bufio.Scanner
	cols  []string
	types []string
	url   string
	line  int
	vals  []any
	err   error
}

func (r *jsonRows) Next() bool {
	for r.sc.Scan() {
		r.line++
		b := bytes.TrimSpace(r.sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if r.err = r.parse(b); r.err != nil {
			return false
		}
		return true
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			r.err = fmt.Errorf("ERROR: Load into table failed: %s line %d: The total size of the json object exceeds the max limit of %d bytes", r.url, r.line+1, maxJSONObject)
		} else {
			r.err = fmt.Errorf("ERROR: reading %s: %v", r.url, err)
		}
	}
	return false
}

func (r *jsonRows) fail(format string, args ...any) error {
	return fmt.Errorf("ERROR: Load into table failed: %s line %d: %s", r.url, r.line, fmt.Sprintf(format, args...))
}

func (r *jsonRows) parse(b []byte) error {
	if !utf8.Valid(b) {
		return r.fail("Invalid UTF8 character")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return r.fail("Invalid JSON object: %v", err)
	}
	r.vals = r.vals[:0]
	for i, col := range r.cols {
		raw, ok := obj[col]
		if !ok || string(raw) == "null" {
			r.vals = append(r.vals, nil)
			continue
		}
		v, err := convert(raw, r.types[i])
		if err != nil {
			return r.fail("column %s: %v", col, err)
		}
		r.vals = append(r.vals, v)
	}
	return nil
}

func convert(raw json.RawMessage, typ string) (any, error) {
	switch typ {
	case "bigint", "integer", "smallint":
		n, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("invalid integer %s", raw)
		}
		return n, nil
	case "jsonb":
		if err := checkSuper(raw); err != nil {
			return nil, err
		}
		return []byte(raw), nil
	case "boolean":
		var v bool
		err := json.Unmarshal(raw, &v)
		return v, err
	default: // character varying, text, timestamp: a JSON string
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("want a string for %s, got %s", typ, raw)
		}
		return s, nil
	}
}

// checkSuper enforces SUPER's default limit on string values, and refuses
// a number beyond DOUBLE PRECISION's range (such as 1e400), which no
// scalar type of a SUPER value holds.
func checkSuper(raw json.RawMessage) error {
	if len(raw) <= maxSuperString && !mayBeOutOfRange(raw) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch v := tok.(type) {
		case string:
			if len(v) > maxSuperString {
				return fmt.Errorf("a string of %d bytes exceeds the SUPER string limit of %d bytes", len(v), maxSuperString)
			}
		case json.Number:
			if _, err := strconv.ParseFloat(string(v), 64); errors.Is(err, strconv.ErrRange) {
				return fmt.Errorf("numeric value %.40q is out of range for type double precision", v)
			}
		}
	}
}

// mayBeOutOfRange reports whether raw may hold a number out of DOUBLE
// PRECISION's range: one written with an exponent (a digit before an e)
// or a run of 300 digits.
func mayBeOutOfRange(raw []byte) bool {
	run := 0
	for i, c := range raw {
		switch {
		case c >= '0' && c <= '9':
			if run++; run >= 300 {
				return true
			}
		case (c == 'e' || c == 'E') && run > 0 && i+1 < len(raw):
			return true
		default:
			run = 0
		}
	}
	return false
}

func (r *jsonRows) Values() ([]any, error) { return r.vals, nil }

func (r *jsonRows) Err() error { return r.err }
