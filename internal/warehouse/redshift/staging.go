package redshift

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/klauspost/compress/gzip"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/warehouse"
)

// Staging layout, under the configured prefix:
//
//	batch-{batch id}/gen-{lease generation}/part-00000.ndjson.gz …
//	batch-{batch id}/gen-{lease generation}/manifest.json
//
// A delivery stages under its own lease generation, so a retried delivery
// never overwrites objects a still-running COPY of an earlier one reads.

// batchPrefix is the staging prefix of every generation of a batch.
func (w *Warehouse) batchPrefix(batchID int64) string {
	return w.prefix + "batch-" + strconv.FormatInt(batchID, 10) + "/"
}

// genPrefix is the staging prefix of one load.
func (w *Warehouse) genPrefix(s warehouse.Slice) string {
	return w.batchPrefix(s.BatchID) + "gen-" + strconv.FormatInt(s.Generation, 10) + "/"
}

// Manifest is a COPY manifest: exactly the parts of one load, each
// mandatory, each with its size.
type Manifest struct {
	Entries []ManifestEntry `json:"entries"`
}

// ManifestEntry names one staging part.
type ManifestEntry struct {
	URL       string       `json:"url"`
	Mandatory bool         `json:"mandatory"`
	Meta      ManifestMeta `json:"meta"`
}

// ManifestMeta carries a part's size in bytes.
type ManifestMeta struct {
	ContentLength int64 `json:"content_length"`
}

// staged is what staging wrote.
type staged struct {
	// ManifestURL is s3://bucket/key of the manifest, empty when the load
	// has no records (COPY fails when it finds no file).
	ManifestURL string
	Records     int64
	Parts       int
	// Bytes is the NDJSON written before compression; Compressed after.
	Bytes, Compressed int64
}

// stage reads the objects' records once and writes them as gzip NDJSON
// parts of at most PartBytes each, then a manifest naming exactly those
// parts. A record Redshift could not load is refused before anything of it
// is written, wrapping folder.ErrMalformed and naming object and line.
func (w *Warehouse) stage(ctx context.Context, s warehouse.Slice, rr *folder.RecordReader) (staged, error) {
	var (
		out     staged
		man     Manifest
		enc     = newLineEncoder(s)
		part    *partWriter
		line    []byte
		prefix  = w.genPrefix(s)
		rotate  = w.cfg.PartBytes - int64(w.cfg.MaxRecordBytes) - 1<<20 // room for one more record and gzip's buffer
		failing = func(err error) (staged, error) {
			if part != nil {
				part.abort(err)
			}
			return staged{}, err
		}
	)
	for rr.Next() {
		rec := rr.Record()
		if err := checkRecord(rec.JSON, w.cfg.MaxStringBytes, w.cfg.MaxDepth); err != nil {
			return failing(fmt.Errorf("%w: %s: line %d: %v", folder.ErrMalformed, rec.ObjectKey, rec.Line, err))
		}
		line = enc.append(line[:0], rec)
		if len(line) > w.cfg.MaxRecordBytes {
			return failing(fmt.Errorf("%w: %s: line %d: the record is %d bytes as staged, over Redshift's limit of %d bytes for one JSON object",
				folder.ErrMalformed, rec.ObjectKey, rec.Line, len(line), w.cfg.MaxRecordBytes))
		}
		if part == nil {
			key := fmt.Sprintf("%spart-%05d.ndjson.gz", prefix, out.Parts)
			part = w.openPart(ctx, key)
			out.Parts++
		}
		line = append(line, '\n')
		if err := part.write(line); err != nil {
			return failing(err)
		}
		out.Records++
		out.Bytes += int64(len(line))
		if part.compressed() >= rotate {
			entry, err := part.close()
			part = nil
			if err != nil {
				return failing(err)
			}
			man.Entries = append(man.Entries, entry)
			out.Compressed += entry.Meta.ContentLength
		}
	}
	if err := rr.Err(); err != nil {
		return failing(err)
	}
	if part != nil {
		entry, err := part.close()
		if err != nil {
			return staged{}, err
		}
		man.Entries = append(man.Entries, entry)
		out.Compressed += entry.Meta.ContentLength
	}
	if out.Records == 0 {
		return out, nil
	}
	body, err := json.Marshal(man)
	if err != nil {
		return staged{}, err
	}
	key := prefix + "manifest.json"
	if _, err := w.s3.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(w.bucket), Key: aws.String(key), Body: strings.NewReader(string(body)),
		ContentType: aws.String("application/json"),
	}); err != nil {
		return staged{}, fmt.Errorf("writing staging manifest s3://%s/%s: %w", w.bucket, key, err)
	}
	out.ManifestURL = "s3://" + w.bucket + "/" + key
	return out, nil
}

// partWriter streams one gzip part into a multipart upload through the
// transfer manager: memory stays at a few upload chunks whatever the part's
// size.
type partWriter struct {
	url  string
	pw   *io.PipeWriter
	cw   *countingWriter
	gz   *gzip.Writer
	done chan error
	err  error
	over bool
}

func (w *Warehouse) openPart(ctx context.Context, key string) *partWriter {
	pr, pw := io.Pipe()
	p := &partWriter{url: "s3://" + w.bucket + "/" + key, pw: pw, done: make(chan error, 1)}
	p.cw = &countingWriter{w: pw}
	p.gz, _ = gzip.NewWriterLevel(p.cw, gzip.DefaultCompression)
	go func() {
		_, err := w.tm.UploadObject(ctx, &transfermanager.UploadObjectInput{
			Bucket: aws.String(w.bucket), Key: aws.String(key), Body: pr,
			ContentType: aws.String("application/x-ndjson"), ContentEncoding: aws.String("gzip"),
		})
		if err != nil {
			err = fmt.Errorf("uploading staging part %s: %w", p.url, err)
		}
		pr.CloseWithError(err) // unblocks the writer if the upload gave up
		p.done <- err
	}()
	return p
}

// wait returns the upload's outcome, once it has ended.
func (p *partWriter) wait() error {
	if !p.over {
		p.err, p.over = <-p.done, true
	}
	return p.err
}

func (p *partWriter) write(b []byte) error {
	if _, err := p.gz.Write(b); err != nil {
		p.pw.CloseWithError(err)
		if uerr := p.wait(); uerr != nil {
			return uerr // the upload's failure is why the write failed
		}
		return err
	}
	return nil
}

func (p *partWriter) compressed() int64 { return p.cw.n }

// close finishes the part and waits for its upload.
func (p *partWriter) close() (ManifestEntry, error) {
	err := p.gz.Close()
	p.pw.CloseWithError(err)
	if uerr := p.wait(); uerr != nil {
		return ManifestEntry{}, uerr
	}
	if err != nil {
		return ManifestEntry{}, err
	}
	return ManifestEntry{URL: p.url, Mandatory: true, Meta: ManifestMeta{ContentLength: p.cw.n}}, nil
}

// abort stops the upload; the transfer manager aborts its multipart upload.
func (p *partWriter) abort(err error) {
	p.pw.CloseWithError(err)
	_ = p.wait()
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// lineEncoder writes a record as the curated row COPY … FORMAT JSON 'auto'
// loads: top-level keys are the columns of curated.fleet_records, and the
// record itself is the SUPER column record.
type lineEncoder struct {
	head    []byte // {"tenant_id":…,"source_scope":…,"batch_id":…,"lease_generation":…,"object_key":
	lastKey string
	keyPart []byte // "key","line_number":
}

func newLineEncoder(s warehouse.Slice) *lineEncoder {
	e := &lineEncoder{}
	e.head = append(e.head, `{"tenant_id":`...)
	e.head = appendJSONString(e.head, s.TenantID)
	e.head = append(e.head, `,"source_scope":`...)
	e.head = appendJSONString(e.head, s.SourceScope)
	e.head = append(e.head, `,"batch_id":`...)
	e.head = strconv.AppendInt(e.head, s.BatchID, 10)
	e.head = append(e.head, `,"lease_generation":`...)
	e.head = strconv.AppendInt(e.head, s.Generation, 10)
	e.head = append(e.head, `,"object_key":`...)
	return e
}

func (e *lineEncoder) append(buf []byte, r folder.Record) []byte {
	if r.ObjectKey != e.lastKey || e.keyPart == nil {
		e.lastKey = r.ObjectKey
		e.keyPart = appendJSONString(e.keyPart[:0], r.ObjectKey)
		e.keyPart = append(e.keyPart, `,"line_number":`...)
	}
	buf = append(buf, e.head...)
	buf = append(buf, e.keyPart...)
	buf = strconv.AppendInt(buf, r.Line, 10)
	buf = append(buf, `,"record":`...)
	buf = append(buf, r.JSON...)
	return append(buf, '}')
}

func appendJSONString(buf []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return append(buf, b...)
}

// checkRecord holds a record (a valid JSON object) to what a SUPER value
// can take: valid UTF-8, no string longer than maxString bytes once
// unescaped, no deeper nesting than maxDepth. Small records are checked for
// UTF-8 only: they cannot break the other limits.
func checkRecord(b []byte, maxString, maxDepth int) error {
	if !utf8.Valid(b) {
		return errors.New("invalid UTF-8")
	}
	if len(b) <= maxString && len(b) <= 2*maxDepth {
		return nil
	}
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '{', '[':
			if depth++; depth > maxDepth {
				return fmt.Errorf("nested more than %d levels deep, Redshift's limit for a SUPER value", maxDepth)
			}
		case '}', ']':
			depth--
		case '"':
			n := 0
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] != '\\' {
					n++
					continue
				}
				i++
				if i < len(b) && b[i] == 'u' && i+4 < len(b) {
					r, _ := strconv.ParseUint(string(b[i+1:i+5]), 16, 32)
					i += 4
					if utf16.IsSurrogate(rune(r)) {
						n += 2 // the other half adds 2 more: 4 bytes in all
					} else {
						n += utf8.RuneLen(rune(r))
					}
					continue
				}
				n++
			}
			if n > maxString {
				return fmt.Errorf("a string value of %d bytes, over Redshift's limit of %d bytes for a string in a SUPER value", n, maxString)
			}
		}
	}
	return nil
}

// deleteStaging removes the staging objects of batch id whose generation is
// at most upTo (0: every generation), once the batch's commit is confirmed
// or its load can no longer run. Newer generations are left alone: a newer
// delivery may be about to COPY them. Failures are logged, not returned: a
// lifecycle rule on the staging prefix is the backstop.
func (w *Warehouse) deleteStaging(ctx context.Context, batchID, upTo int64) {
	ctx, done := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
	defer done()
	prefix := w.batchPrefix(batchID)
	var keys []s3types.ObjectIdentifier
	pages := s3.NewListObjectsV2Paginator(w.s3, &s3.ListObjectsV2Input{Bucket: aws.String(w.bucket), Prefix: aws.String(prefix)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			w.cfg.Logger.Warn("listing staging objects", "batch_id", batchID, "prefix", prefix, "error", err)
			return
		}
		for _, o := range page.Contents {
			gen, ok := generationOf(strings.TrimPrefix(aws.ToString(o.Key), prefix))
			if ok && (upTo == 0 || gen <= upTo) {
				keys = append(keys, s3types.ObjectIdentifier{Key: o.Key})
			}
		}
	}
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		out, err := w.s3.DeleteObjects(ctx, &s3.DeleteObjectsInput{
			Bucket: aws.String(w.bucket), Delete: &s3types.Delete{Objects: keys[:n], Quiet: aws.Bool(true)},
		})
		if err == nil && len(out.Errors) > 0 {
			err = fmt.Errorf("%d objects not deleted, first %s: %s", len(out.Errors), aws.ToString(out.Errors[0].Key), aws.ToString(out.Errors[0].Message))
		}
		if err != nil {
			w.cfg.Logger.Warn("deleting staging objects", "batch_id", batchID, "prefix", prefix, "error", err)
			return
		}
		keys = keys[n:]
	}
}

// generationOf reads N from "gen-N/…".
func generationOf(rest string) (int64, bool) {
	g, _, ok := strings.Cut(strings.TrimPrefix(rest, "gen-"), "/")
	if !ok || !strings.HasPrefix(rest, "gen-") {
		return 0, false
	}
	n, err := strconv.ParseInt(g, 10, 64)
	return n, err == nil
}
