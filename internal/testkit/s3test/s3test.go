// Package s3test runs an S3-compatible server in-process for tests: gofakes3
// with its in-memory backend, on a loopback httptest listener, reached
// through the real AWS SDK (path-style addressing, static credentials).
//
// Code under test finds it the way production code finds S3: through the
// AWS SDK's configuration. Env returns the variables (AWS_ENDPOINT_URL_S3,
// static credentials, a region, IMDS disabled) for a child process; SetEnv
// sets them in this process, for a package's TestMain, so that every
// test of the package may run in parallel; Client returns an SDK client on
// the server for test setup.
//
// Faults: Throttle makes the next requests to a bucket fail with 503
// SlowDown, as S3 does under load; Slow delays every object read of a
// bucket, as a large object's transfer would, and SlowListing every
// listing page. Requests counts the requests
// made to a bucket by S3 operation, so tests can see multipart uploads and
// list pages; Reads counts the reads of one object.
//
// Listings (ListObjectsV2) are answered by this package from gofakes3's
// backend, as Amazon S3 writes them, because gofakes3 ignores encoding-type
// and its XML encoder turns a control character into U+FFFD. Without
// encoding-type=url a key holding a character XML 1.0 does not allow
// (U+0001) is written as a character reference (&#x1;), which Go's XML
// decoder, like any conforming parser, refuses ("illegal character code
// U+0001"): the page cannot be read, exactly as with S3 (aws-sdk-go#1914).
// With encoding-type=url, Key, Prefix, StartAfter, Delimiter and
// CommonPrefixes are URL-encoded as S3 encodes them (a form value, "/"
// left as it is: url.QueryUnescape reverses it) and the page says
// <EncodingType>url</EncodingType>; any other encoding-type is refused
// 400 InvalidArgument. Paging is gofakes3's (see listObjectsV2). The
// owner (fetch-owner) is never listed.
//
// What it does not emulate: authentication (any credentials are accepted),
// bucket policies and ownership, regions and redirects, storage classes,
// eventual consistency, S3's own request rate limits (only the injected
// SlowDown answers), and URL-encoded keys in the older ListObjects (v1),
// which gofakes3 answers itself and which nothing here uses.
package s3test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// Region is the region every client of the server uses.
const Region = "us-east-1"

// Server is an in-process S3-compatible server.
type Server struct {
	// URL is the server's base URL (http://127.0.0.1:port).
	URL string

	srv     *httptest.Server
	backend gofakes3.Backend // what the listings are answered from

	mu       sync.Mutex
	throttle map[string]int            // bucket → requests left to answer 503 SlowDown
	slow     map[string]time.Duration  // bucket → delay before each GetObject answer
	slowList map[string]time.Duration  // bucket → delay before each ListObjectsV2 answer
	requests map[string]map[string]int // bucket → operation → count
	reads    map[string]int            // bucket/key → GetObject count
}

// New starts a server; Close stops it. Tests use Start.
func New() *Server {
	s := &Server{throttle: map[string]int{}, slow: map[string]time.Duration{}, slowList: map[string]time.Duration{}, requests: map[string]map[string]int{}, reads: map[string]int{}}
	s.backend = s3mem.New()
	fake := gofakes3.New(s.backend, gofakes3.WithLogger(gofakes3.DiscardLog()))
	inner := fake.Server()
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bucket, op := classify(r)
		s.mu.Lock()
		if s.requests[bucket] == nil {
			s.requests[bucket] = map[string]int{}
		}
		s.requests[bucket][op]++
		throttled := s.throttle[bucket] > 0
		if throttled {
			s.throttle[bucket]--
		}
		delay := time.Duration(0)
		switch op {
		case "GetObject":
			s.reads[strings.TrimPrefix(r.URL.Path, "/")]++
			delay = s.slow[bucket]
		case "ListObjectsV2":
			delay = s.slowList[bucket]
		}
		s.mu.Unlock()
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
		}
		if throttled {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><RequestId>s3test</RequestId></Error>`)
			return
		}
		if op == "ListObjectsV2" && s.listObjectsV2(w, r, bucket) {
			return
		}
		inner.ServeHTTP(w, r)
	}))
	s.URL = s.srv.URL
	return s
}

// Start starts a server that stops when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := New()
	t.Cleanup(s.Close)
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Env returns the environment that points the AWS SDK's S3 clients at the
// server: endpoint, static credentials, region, and no instance metadata
// lookups (which would leave the machine).
func (s *Server) Env() []string {
	return []string{
		"AWS_ENDPOINT_URL_S3=" + s.URL,
		"AWS_ACCESS_KEY_ID=s3test",
		"AWS_SECRET_ACCESS_KEY=s3test-secret",
		"AWS_REGION=" + Region,
		"AWS_EC2_METADATA_DISABLED=true",
		// Checksums in headers rather than aws-chunked trailers, which
		// gofakes3 does not decode.
		"AWS_REQUEST_CHECKSUM_CALCULATION=when_required",
		"AWS_RESPONSE_CHECKSUM_VALIDATION=when_required",
	}
}

// SetEnv sets Env in this process. Call it from TestMain, before any test
// runs: tests that change the environment cannot run in parallel.
func (s *Server) SetEnv() {
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
}

// Config returns an AWS SDK configuration with the server's static
// credentials and region (and no other source of configuration).
func (s *Server) Config() aws.Config {
	return aws.Config{
		Region:                     Region,
		Credentials:                credentials.NewStaticCredentialsProvider("s3test", "s3test-secret", ""),
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	}
}

// Client returns an S3 client on the server.
func (s *Server) Client() *s3.Client {
	return s3.NewFromConfig(s.Config(), func(o *s3.Options) {
		o.BaseEndpoint = aws.String(s.URL)
		o.UsePathStyle = true
	})
}

// CreateBucket creates a bucket, failing t on error.
func (s *Server) CreateBucket(t testing.TB, name string) {
	t.Helper()
	if _, err := s.Client().CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("creating bucket %s: %v", name, err)
	}
}

// Put writes an object, failing t on error.
func (s *Server) Put(t testing.TB, bucket, key string, body []byte) {
	t.Helper()
	_, err := s.Client().PutObject(context.Background(), &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(key), Body: strings.NewReader(string(body)),
	})
	if err != nil {
		t.Fatalf("writing s3://%s/%s: %v", bucket, key, err)
	}
}

// Throttle makes the next n requests to bucket fail with 503 SlowDown.
func (s *Server) Throttle(bucket string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.throttle[bucket] = n
}

// Slow delays the answer to every object read (GetObject) of bucket by d;
// 0 ends the delay.
func (s *Server) Slow(bucket string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slow[bucket] = d
}

// SlowListing delays the answer to every listing page (ListObjectsV2) of
// bucket by d, as S3's own page latency would; 0 ends the delay.
func (s *Server) SlowListing(bucket string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slowList[bucket] = d
}

// Reads returns how many times the object bucket/key was read (GetObject).
func (s *Server) Reads(bucket, key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[bucket+"/"+key]
}

// Requests returns how many requests bucket received for operation (as
// named by S3: ListObjectsV2, GetObject, PutObject, CreateMultipartUpload,
// UploadPart, CompleteMultipartUpload, DeleteObjects, …), throttled ones
// included.
func (s *Server) Requests(bucket, operation string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[bucket][operation]
}

// classify names a path-style request's bucket and S3 operation.
func classify(r *http.Request) (bucket, op string) {
	path := strings.TrimPrefix(r.URL.Path, "/")
	bucket, key, _ := strings.Cut(path, "/")
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && key == "" && q.Get("list-type") == "2":
		op = "ListObjectsV2"
	case r.Method == http.MethodGet && key == "":
		op = "ListObjects"
	case r.Method == http.MethodPut && key == "":
		op = "CreateBucket"
	case r.Method == http.MethodPost && key == "" && q.Has("delete"):
		op = "DeleteObjects"
	case r.Method == http.MethodPost && q.Has("uploads"):
		op = "CreateMultipartUpload"
	case r.Method == http.MethodPut && q.Has("uploadId"):
		op = "UploadPart"
	case r.Method == http.MethodPost && q.Has("uploadId"):
		op = "CompleteMultipartUpload"
	case r.Method == http.MethodDelete && q.Has("uploadId"):
		op = "AbortMultipartUpload"
	case r.Method == http.MethodPut:
		op = "PutObject"
	case r.Method == http.MethodGet:
		op = "GetObject"
	case r.Method == http.MethodHead:
		op = "HeadObject"
	case r.Method == http.MethodDelete:
		op = "DeleteObject"
	default:
		op = r.Method
	}
	return bucket, op
}
