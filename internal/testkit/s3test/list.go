package s3test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/johannesboyne/gofakes3"
)

// listObjectsV2 answers a ListObjectsV2 request from the backend as Amazon
// S3 writes the page (see the package comment), and reports whether it
// did. It leaves every refusal — a bucket that does not exist, a max-keys
// or continuation-token gofakes3 cannot parse — to gofakes3 (false), which
// answers the same request with its own error.
//
// Paging is gofakes3's own: MaxKeys defaults to and is clamped to 1,000
// (0 is no limit, as gofakes3 has it); a continuation token is the base64
// of the last key of the previous page and wins over start-after; the
// backend (s3mem) answers keys after the marker, truncating at MaxKeys.
func (s *Server) listObjectsV2(w http.ResponseWriter, r *http.Request, bucket string) bool {
	if ok, err := s.backend.BucketExists(bucket); err != nil || !ok {
		return false
	}
	q := r.URL.Query()
	encode := func(v string) string { return v }
	switch q.Get("encoding-type") {
	case "":
	case "url":
		encode = urlEncode
	default:
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidArgument</Code><Message>Invalid Encoding Method specified in Request</Message><RequestId>s3test</RequestId></Error>`)
		return true
	}
	prefix := gofakes3.Prefix{Prefix: q.Get("prefix"), Delimiter: q.Get("delimiter")}
	prefix.HasPrefix, prefix.HasDelimiter = prefix.Prefix != "", prefix.Delimiter != ""
	page := gofakes3.ListBucketPage{MaxKeys: gofakes3.DefaultMaxBucketKeys}
	if v := q.Get("max-keys"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return false
		}
		page.MaxKeys = min(max(n, 0), gofakes3.MaxBucketKeys)
	}
	switch {
	case q.Has("continuation-token"):
		tok, err := base64.URLEncoding.DecodeString(q.Get("continuation-token"))
		if err != nil {
			return false
		}
		page.Marker, page.HasMarker = string(tok), true
	case q.Has("start-after"):
		page.Marker, page.HasMarker = q.Get("start-after"), true
	}
	objects, err := s.backend.ListBucket(bucket, &prefix, page)
	if err != nil {
		return false
	}

	var b strings.Builder
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	b.WriteString(`<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">`)
	element(&b, "Name", bucket)
	element(&b, "Prefix", encode(prefix.Prefix))
	if prefix.HasDelimiter {
		element(&b, "Delimiter", encode(prefix.Delimiter))
	}
	element(&b, "MaxKeys", strconv.FormatInt(page.MaxKeys, 10))
	if q.Get("encoding-type") == "url" {
		element(&b, "EncodingType", "url")
	}
	element(&b, "KeyCount", strconv.Itoa(len(objects.Contents)+len(objects.CommonPrefixes)))
	element(&b, "IsTruncated", strconv.FormatBool(objects.IsTruncated))
	if q.Has("continuation-token") {
		element(&b, "ContinuationToken", q.Get("continuation-token"))
	}
	if objects.NextMarker != "" {
		element(&b, "NextContinuationToken", base64.URLEncoding.EncodeToString([]byte(objects.NextMarker)))
	}
	if v := q.Get("start-after"); v != "" {
		element(&b, "StartAfter", encode(v))
	}
	for _, c := range objects.Contents {
		b.WriteString("<Contents>")
		element(&b, "Key", encode(c.Key))
		if !c.LastModified.IsZero() {
			element(&b, "LastModified", c.LastModified.UTC().Format("2006-01-02T15:04:05.999Z"))
		}
		element(&b, "ETag", c.ETag)
		element(&b, "Size", strconv.FormatInt(c.Size, 10))
		if c.StorageClass != "" {
			element(&b, "StorageClass", string(c.StorageClass))
		}
		b.WriteString("</Contents>")
	}
	for _, p := range objects.CommonPrefixes {
		b.WriteString("<CommonPrefixes>")
		element(&b, "Prefix", encode(p.Prefix))
		b.WriteString("</CommonPrefixes>")
	}
	b.WriteString("</ListBucketResult>")
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(b.String()))
	return true
}

// element writes <name>text</name>, text escaped as S3 escapes it.
func element(b *strings.Builder, name, text string) {
	b.WriteString("<" + name + ">")
	escapeText(b, text)
	b.WriteString("</" + name + ">")
}

// escapeText writes s as XML character data the way Amazon S3 does in a
// listing: the five predefined entities, and a numeric character reference
// for a carriage return, a line feed, a tab and every character XML 1.0
// does not allow, so U+0001 is written &#x1; — which a conforming parser
// (Go's encoding/xml among them) refuses, as it refuses S3's page. (Go's
// own encoder, which gofakes3 uses, writes U+FFFD instead: a different
// key, and a page that decodes.) An invalid UTF-8 byte, which S3 never
// stores, is written as U+FFFD (WriteRune of utf8.RuneError).
func escapeText(b *strings.Builder, s string) {
	for _, r := range s {
		switch {
		case r == '&':
			b.WriteString("&amp;")
		case r == '<':
			b.WriteString("&lt;")
		case r == '>':
			b.WriteString("&gt;")
		case r == '"':
			b.WriteString("&quot;")
		case r == '\'':
			b.WriteString("&apos;")
		case r == '\t' || r == '\n' || r == '\r' || !xmlChar(r):
			fmt.Fprintf(b, "&#x%X;", r)
		default:
			b.WriteRune(r)
		}
	}
}

// xmlChar reports whether r is a character XML 1.0 allows in a document
// (its production Char, less the tab, line feed and carriage return that
// escapeText writes as references).
func xmlChar(r rune) bool {
	return r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF
}

// urlEncode encodes a key (or prefix, delimiter, start-after) as S3 does
// for encoding-type=url: as a form value — a space is "+", a "+" is "%2B",
// every byte but letters, digits and -_.~ percent-encoded — except "/",
// which stays as it is. url.QueryUnescape reverses it.
func urlEncode(s string) string {
	return strings.ReplaceAll(url.QueryEscape(s), "%2F", "/")
}
