package redshift

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
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
//	batch-{batch id}/gen-{lease generation}/ledger.ndjson.gz
//	batch-{batch id}/gen-{lease generation}/ledger-manifest.json
//	batch-{batch id}/gen-{lease generation}/errors.ndjson.gz
//	batch-{batch id}/gen-{lease generation}/errors-manifest.json
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

// manifestURL is where a load's manifest is staged.
func (w *Warehouse) manifestURL(s warehouse.Slice) string {
	return "s3://" + w.bucket + "/" + w.genPrefix(s) + "manifest.json"
}

// ledgerManifestURL is where a load's ledger manifest is staged.
func (w *Warehouse) ledgerManifestURL(s warehouse.Slice) string {
	return "s3://" + w.bucket + "/" + w.genPrefix(s) + "ledger-manifest.json"
}

// errorsManifestURL is where a load's errors manifest is staged.
func (w *Warehouse) errorsManifestURL(s warehouse.Slice) string {
	return "s3://" + w.bucket + "/" + w.genPrefix(s) + "errors-manifest.json"
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
// parts, counting each record in ledger. A record Redshift could not load
// is a bad record (folder.BadRecord, naming object and line), refused
// before anything of it is written: skipped within the import's tolerance
// (rr.Reject; rr.Bad lists it with the reader's own), else the end of the
// load.
func (w *Warehouse) stage(ctx context.Context, s warehouse.Slice, rr *folder.RecordReader, ledger *warehouse.LedgerCounter) (staged, error) {
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
				part.abort()
			}
			return staged{}, err
		}
	)
	// reject reports a record Redshift could not load as a bad record of
	// rr, within the import's tolerance like the reader's own: nil when it
	// is skipped.
	reject := func(rec folder.Record, reason string) error {
		return rr.Reject(&folder.BadRecord{ObjectKey: rec.ObjectKey, Line: rec.Line, Reason: reason, Excerpt: folder.Excerpt(rec.JSON)})
	}
	for rr.Next() {
		rec := rr.Record()
		if err := checkRecord(rec.JSON, w.cfg.MaxStringBytes, w.cfg.MaxDepth); err != nil {
			if err := reject(rec, err.Error()); err != nil {
				return failing(err)
			}
			continue
		}
		line = enc.append(line[:0], rec)
		if len(line) > w.cfg.MaxRecordBytes {
			if err := reject(rec, fmt.Sprintf("the record is %d bytes as staged, over Redshift's limit of %d bytes for one JSON object",
				len(line), w.cfg.MaxRecordBytes)); err != nil {
				return failing(err)
			}
			continue
		}
		if part == nil {
			key := fmt.Sprintf("%spart-%05d.ndjson.gz", prefix, out.Parts)
			part = w.openPart(ctx, key)
			out.Parts++
		}
		line = append(line, '\n')
		if err := part.write(line); err != nil {
			part = nil
			return failing(err)
		}
		out.Records++
		out.Bytes += int64(len(line))
		ledger.Count(rec.ObjectKey)
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
	out.ManifestURL = w.manifestURL(s)
	return out, nil
}

// stageLedger writes a load's ledger rows as one gzip NDJSON part (the
// columns of curated.fleet_load_objects, times in COPY's default
// TIMESTAMP format, UTC) and a manifest naming it, and returns the
// manifest's URL. It is staged even without rows (an empty part): the
// load's COPY transaction always loads it, so that the swap always
// replaces the ledger.
func (w *Warehouse) stageLedger(ctx context.Context, s warehouse.Slice, objects []warehouse.LedgerObject) (string, error) {
	prefix := w.genPrefix(s)
	part := w.openPart(ctx, prefix+"ledger.ndjson.gz")
	var line []byte
	for _, o := range objects {
		line = appendLedgerLine(line[:0], o)
		if err := part.write(line); err != nil {
			return "", err
		}
	}
	return w.closeSmallPart(ctx, part, prefix+"ledger-manifest.json")
}

// stageErrors writes a load's errors (the bad records its reader skipped)
// as one gzip NDJSON part (the columns of curated.fleet_load_errors) and a
// manifest naming it, and returns the manifest's URL. Like the ledger it
// is staged even without rows, so that the swap always replaces the
// slice's errors.
func (w *Warehouse) stageErrors(ctx context.Context, s warehouse.Slice, errs []warehouse.LoadError) (string, error) {
	prefix := w.genPrefix(s)
	part := w.openPart(ctx, prefix+"errors.ndjson.gz")
	var line []byte
	for _, e := range errs {
		line = appendErrorLine(line[:0], e)
		if err := part.write(line); err != nil {
			return "", err
		}
	}
	return w.closeSmallPart(ctx, part, prefix+"errors-manifest.json")
}

// closeSmallPart closes a one-part load (the ledger's, the errors') and
// writes a manifest naming it at key; it returns the manifest's URL.
func (w *Warehouse) closeSmallPart(ctx context.Context, part *partWriter, key string) (string, error) {
	entry, err := part.close()
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(Manifest{Entries: []ManifestEntry{entry}})
	if err != nil {
		return "", err
	}
	if _, err := w.s3.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(w.bucket), Key: aws.String(key), Body: strings.NewReader(string(body)),
		ContentType: aws.String("application/json"),
	}); err != nil {
		return "", fmt.Errorf("writing staging manifest s3://%s/%s: %w", w.bucket, key, err)
	}
	return "s3://" + w.bucket + "/" + key, nil
}

// copyTimeLayout is COPY's default TIMESTAMP format, with microseconds.
const copyTimeLayout = "2006-01-02 15:04:05.999999"

// appendLedgerLine appends one ledger row as the NDJSON line COPY … FORMAT
// JSON 'auto' loads into curated.fleet_load_objects.
func appendLedgerLine(buf []byte, o warehouse.LedgerObject) []byte {
	buf = append(buf, `{"tenant_id":`...)
	buf = appendJSONString(buf, o.TenantID)
	buf = append(buf, `,"source_scope":`...)
	buf = appendJSONString(buf, o.SourceScope)
	buf = append(buf, `,"batch_id":`...)
	buf = strconv.AppendInt(buf, o.BatchID, 10)
	if o.BatchUID != "" {
		buf = append(buf, `,"batch_uid":`...)
		buf = appendJSONString(buf, o.BatchUID)
	}
	buf = append(buf, `,"object_key":`...)
	buf = appendJSONString(buf, o.ObjectKey)
	buf = append(buf, `,"etag":`...)
	buf = appendJSONString(buf, o.ETag)
	buf = append(buf, `,"size_bytes":`...)
	buf = strconv.AppendInt(buf, o.SizeBytes, 10)
	buf = append(buf, `,"record_count":`...)
	buf = strconv.AppendInt(buf, o.RecordCount, 10)
	buf = append(buf, `,"last_modified":`...)
	buf = appendJSONString(buf, o.LastModified.UTC().Format(copyTimeLayout))
	if o.MarkerModified != nil {
		buf = append(buf, `,"marker_modified":`...)
		buf = appendJSONString(buf, o.MarkerModified.UTC().Format(copyTimeLayout))
	}
	return append(buf, "}\n"...)
}

// appendErrorLine appends one load error as the NDJSON line COPY …
// FORMAT JSON 'auto' loads into curated.fleet_load_errors.
func appendErrorLine(buf []byte, e warehouse.LoadError) []byte {
	buf = append(buf, `{"tenant_id":`...)
	buf = appendJSONString(buf, e.TenantID)
	buf = append(buf, `,"source_scope":`...)
	buf = appendJSONString(buf, e.SourceScope)
	buf = append(buf, `,"batch_id":`...)
	buf = strconv.AppendInt(buf, e.BatchID, 10)
	if e.BatchUID != "" {
		buf = append(buf, `,"batch_uid":`...)
		buf = appendJSONString(buf, e.BatchUID)
	}
	buf = append(buf, `,"ordinal":`...)
	buf = strconv.AppendInt(buf, e.Ordinal, 10)
	buf = append(buf, `,"object_key":`...)
	buf = appendJSONString(buf, e.ObjectKey)
	buf = append(buf, `,"line_number":`...)
	buf = strconv.AppendInt(buf, e.Line, 10)
	buf = append(buf, `,"column_number":`...)
	buf = strconv.AppendInt(buf, int64(e.Column), 10)
	buf = append(buf, `,"reason":`...)
	buf = appendJSONString(buf, e.Reason)
	buf = append(buf, `,"raw_excerpt":`...)
	buf = appendJSONString(buf, e.Excerpt)
	return append(buf, "}\n"...)
}

// partWriter streams one gzip part to S3. Its compressed bytes go into one
// buffer of UploadPartBytes; each time it fills, it is sent as the next part
// of a multipart upload. So a part of any size costs one upload chunk of
// memory. (The SDK's transfer manager would buffer the first chunk and then
// Concurrency+1 more to overlap compression and upload; staging a million
// rows stays within 64 MiB only without them.) A part smaller than one chunk
// is a single PutObject.
type partWriter struct {
	w        *Warehouse
	ctx      context.Context
	key, url string
	buf      []byte
	uploadID *string
	parts    []s3types.CompletedPart
	n        int64 // compressed bytes written
	gz       *gzip.Writer
	err      error
}

func (w *Warehouse) openPart(ctx context.Context, key string) *partWriter {
	p := &partWriter{w: w, ctx: ctx, key: key, url: "s3://" + w.bucket + "/" + key, buf: w.chunk()}
	p.gz, _ = gzip.NewWriterLevel((*partSink)(p), gzip.DefaultCompression)
	return p
}

// chunk returns an upload buffer, reusing the last part's.
func (w *Warehouse) chunk() []byte {
	if b, ok := w.chunks.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, w.cfg.UploadPartBytes)
}

// partSink receives the compressed bytes.
type partSink partWriter

func (s *partSink) Write(b []byte) (int, error) {
	p := (*partWriter)(s)
	if p.err != nil {
		return 0, p.err
	}
	written := 0
	for len(b) > 0 {
		room := cap(p.buf) - len(p.buf)
		if room == 0 {
			if p.err = p.flush(); p.err != nil {
				return written, p.err
			}
			room = cap(p.buf)
		}
		k := min(room, len(b))
		p.buf = append(p.buf, b[:k]...)
		b, written, p.n = b[k:], written+k, p.n+int64(k)
	}
	return written, nil
}

// flush sends the buffer as the next part of the multipart upload.
func (p *partWriter) flush() error {
	s3c, bucket := p.w.s3, aws.String(p.w.bucket)
	if p.uploadID == nil {
		out, err := s3c.CreateMultipartUpload(p.ctx, &s3.CreateMultipartUploadInput{
			Bucket: bucket, Key: aws.String(p.key),
			ContentType: aws.String("application/x-ndjson"), ContentEncoding: aws.String("gzip"),
		})
		if err != nil {
			return fmt.Errorf("uploading staging part %s: %w", p.url, err)
		}
		p.uploadID = out.UploadId
	}
	num := int32(len(p.parts) + 1)
	out, err := s3c.UploadPart(p.ctx, &s3.UploadPartInput{
		Bucket: bucket, Key: aws.String(p.key), UploadId: p.uploadID, PartNumber: aws.Int32(num),
		Body: bytes.NewReader(p.buf), ContentLength: aws.Int64(int64(len(p.buf))),
	})
	if err != nil {
		return fmt.Errorf("uploading chunk %d of staging part %s: %w", num, p.url, err)
	}
	p.parts = append(p.parts, s3types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(num),
		ChecksumCRC32: out.ChecksumCRC32, ChecksumCRC32C: out.ChecksumCRC32C, ChecksumCRC64NVME: out.ChecksumCRC64NVME,
		ChecksumSHA1: out.ChecksumSHA1, ChecksumSHA256: out.ChecksumSHA256})
	p.buf = p.buf[:0]
	return nil
}

func (p *partWriter) write(b []byte) error {
	if _, err := p.gz.Write(b); err != nil {
		p.abort()
		return err
	}
	return nil
}

func (p *partWriter) compressed() int64 { return p.n }

// close finishes the part: the last chunk and the multipart completion, or
// one PutObject for a part smaller than a chunk.
func (p *partWriter) close() (ManifestEntry, error) {
	defer p.release()
	if err := p.gz.Close(); err != nil {
		p.abort()
		return ManifestEntry{}, err
	}
	s3c, bucket, key := p.w.s3, aws.String(p.w.bucket), aws.String(p.key)
	if p.uploadID == nil {
		_, err := s3c.PutObject(p.ctx, &s3.PutObjectInput{
			Bucket: bucket, Key: key, Body: bytes.NewReader(p.buf), ContentLength: aws.Int64(int64(len(p.buf))),
			ContentType: aws.String("application/x-ndjson"), ContentEncoding: aws.String("gzip"),
		})
		if err != nil {
			return ManifestEntry{}, fmt.Errorf("uploading staging part %s: %w", p.url, err)
		}
	} else {
		if len(p.buf) > 0 {
			if err := p.flush(); err != nil {
				p.abort()
				return ManifestEntry{}, err
			}
		}
		_, err := s3c.CompleteMultipartUpload(p.ctx, &s3.CompleteMultipartUploadInput{
			Bucket: bucket, Key: key, UploadId: p.uploadID, MultipartUpload: &s3types.CompletedMultipartUpload{Parts: p.parts},
		})
		if err != nil {
			p.abort()
			return ManifestEntry{}, fmt.Errorf("completing staging part %s: %w", p.url, err)
		}
	}
	return ManifestEntry{URL: p.url, Mandatory: true, Meta: ManifestMeta{ContentLength: p.n}}, nil
}

// abort gives up the part: an open multipart upload is aborted, so S3 keeps
// none of its chunks.
func (p *partWriter) abort() {
	if p.uploadID != nil {
		ctx, done := context.WithTimeout(context.WithoutCancel(p.ctx), 30*time.Second)
		defer done()
		if _, err := p.w.s3.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{
			Bucket: aws.String(p.w.bucket), Key: aws.String(p.key), UploadId: p.uploadID,
		}); err != nil {
			p.w.cfg.Logger.Warn("aborting staging upload", "part", p.url, "error", err)
		}
		p.uploadID = nil
	}
	p.release()
}

// release returns the buffer for the next part.
func (p *partWriter) release() {
	if p.buf != nil {
		b := p.buf[:0]
		p.w.chunks.Put(&b)
		p.buf = nil
	}
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

// checkRecord holds a record (a valid JSON object, valid UTF-8: the
// reader refuses invalid UTF-8, and numbers beyond DOUBLE PRECISION with
// refuseDouble) to what else a SUPER value can take: no string longer than
// maxString bytes once unescaped, no deeper nesting than maxDepth. Small
// records cannot break these limits.
func checkRecord(b []byte, maxString, maxDepth int) error {
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
	// URL-encoded keys, as every listing of the project asks: the staging
	// prefix holds only keys this package wrote, but a page is never left
	// to a key XML cannot carry.
	pages := s3.NewListObjectsV2Paginator(w.s3, &s3.ListObjectsV2Input{Bucket: aws.String(w.bucket), Prefix: aws.String(prefix), EncodingType: s3types.EncodingTypeUrl})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			w.cfg.Logger.Warn("listing staging objects", "batch_id", batchID, "prefix", prefix, "error", err)
			return
		}
		for _, o := range page.Contents {
			key, err := folder.DecodeListedKey(aws.ToString(o.Key))
			if err != nil {
				w.cfg.Logger.Warn("listing staging objects", "batch_id", batchID, "prefix", prefix, "error", err)
				continue
			}
			gen, ok := generationOf(strings.TrimPrefix(key, prefix))
			if ok && (upTo == 0 || gen <= upTo) {
				keys = append(keys, s3types.ObjectIdentifier{Key: aws.String(key)})
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
