package folder

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"
	"gocloud.dev/blob/memblob"
	_ "gocloud.dev/blob/s3blob" // registers s3:// on blob's default URL mux
	"gocloud.dev/gcerrors"
)

// Format is the format of a data object.
type Format string

// Data formats, chosen by file extension (case-insensitive).
const (
	FormatCSV    Format = "csv"    // .csv: comma-separated, header row first
	FormatNDJSON Format = "ndjson" // .ndjson, .jsonl: one JSON object per line
)

// Object is one data object of a folder.
type Object struct {
	// Key is the object key in the bucket (for file folders, relative to
	// the folder).
	Key    string
	Size   int64
	Format Format
	// ETag identifies the object's content as its store names it: S3's
	// ETag without its quotes, else the hex MD5 the store reports (empty
	// when it reports none, as a local file may).
	ETag string
	// LastModified is the store's last-modified time of the object.
	LastModified time.Time
}

// Listing is what a folder holds: its data objects in key order, and the
// objects that are not data (markers such as _SUCCESS, Spark's
// _temporary/…), also in key order, with keys relative to the folder.
type Listing struct {
	Objects []Object
	Markers []Object
}

// Marker returns the marker named name (relative to the folder), and false
// if the folder holds none.
func (l Listing) Marker(name string) (Object, bool) {
	for _, m := range l.Markers {
		if m.Key == name {
			return m, true
		}
	}
	return Object{}, false
}

// IsMarker reports whether the object named by key, relative to its folder,
// is not data: _SUCCESS, manifest.json, and anything whose name or any
// directory of it starts with "_" or "." (such as _temporary/ of Spark).
func IsMarker(key string) bool {
	for _, seg := range strings.Split(key, "/") {
		if strings.HasPrefix(seg, "_") || strings.HasPrefix(seg, ".") {
			return true
		}
	}
	return strings.EqualFold(path.Base(key), "manifest.json")
}

// FormatOf returns the data format of an object key, or false if its
// extension is not a supported data format.
func FormatOf(key string) (Format, bool) {
	switch strings.ToLower(path.Ext(key)) {
	case ".csv":
		return FormatCSV, true
	case ".ndjson", ".jsonl":
		return FormatNDJSON, true
	}
	return "", false
}

// Errors of Source.
var (
	// ErrEmpty means the folder holds no data objects.
	ErrEmpty = errors.New("folder holds no data objects")
	// ErrUnsupportedObject means an object is neither data nor a marker.
	ErrUnsupportedObject = errors.New("unsupported object in folder")
)

// Opener opens the buckets behind folders: s3:// through the AWS SDK's
// default credential chain, region (AWS_REGION) and endpoint
// (AWS_ENDPOINT_URL_S3, for an S3-compatible store), file:// on the local
// file system, and mem:// as process-wide named in-memory buckets that tests
// and the demo can fill with MemBucket. Its Limits bound the records read
// from what it opens.
type Opener struct {
	Limits Limits
	// S3PathStyle addresses s3:// buckets by path (endpoint/bucket/key)
	// rather than by host name (bucket.endpoint/key), as S3-compatible
	// stores at an endpoint of their own (MinIO, Ceph RGW) need.
	S3PathStyle bool
}

// Open returns a Source reading f.
func (o Opener) Open(ctx context.Context, f Folder) (*Source, error) {
	s := &Source{Folder: f, keyPrefix: f.Prefix + "/", limits: o.Limits}
	var err error
	switch f.Scheme {
	case SchemeS3:
		u := "s3://" + f.Bucket // a valid bucket name (ValidateBucketName): nothing to escape
		if o.S3PathStyle {
			u += "?use_path_style=true"
		}
		s.bucket, err = blob.OpenBucket(ctx, u)
	case SchemeFile:
		s.bucket, err = fileblob.OpenBucket("/"+f.Prefix, &fileblob.Options{Metadata: fileblob.MetadataDontWrite})
		s.keyPrefix = ""
	case SchemeMem:
		s.bucket, s.shared = MemBucket(f.Bucket), true
	default:
		err = fmt.Errorf("unsupported scheme %q", f.Scheme)
	}
	if err != nil {
		return nil, fmt.Errorf("opening folder %s: %w", f, err)
	}
	return s, nil
}

var (
	memMu      sync.Mutex
	memBuckets = map[string]*blob.Bucket{}
)

// MemBucket returns the process-wide in-memory bucket of the given name,
// creating it empty on first use. mem://name/prefix folders read from it.
func MemBucket(name string) *blob.Bucket {
	memMu.Lock()
	defer memMu.Unlock()
	b, ok := memBuckets[strings.ToLower(name)]
	if !ok {
		b = memblob.OpenBucket(nil)
		memBuckets[strings.ToLower(name)] = b
	}
	return b
}

// Source reads the objects of one folder.
type Source struct {
	Folder    Folder
	bucket    *blob.Bucket
	keyPrefix string // the folder's prefix within bucket, "" or ending in "/"
	shared    bool   // bucket belongs to the mem registry: never closed
	limits    Limits
	progress  Progress
	maxBad    int // bad records its readers skip (Tolerate)
}

// Close releases the bucket.
func (s *Source) Close() error {
	if s.shared {
		return nil
	}
	return s.bucket.Close()
}

// Objects lists the folder's data objects recursively, in key order,
// skipping markers. It returns ErrEmpty when there are none, an error
// wrapping ErrUnsupportedObject for an object that is neither data nor a
// marker, an error wrapping ErrUnreadableKey, naming the key escaped, for
// an object of the folder (a marker too) whose key cannot be read as
// itself (CheckKey; on S3 also a key gocloud's s3blob would read as
// another, one holding its "__0x2f__" escapes), and the storage error
// when the folder cannot be listed.
//
// S3 is asked for URL-encoded keys (EncodingType url), so that a key
// holding a character XML does not allow (U+0001) fails its own folder
// here, with that error, instead of making the listing page undecodable.
func (s *Source) Objects(ctx context.Context) ([]Object, error) {
	l, err := s.List(ctx)
	return l.Objects, err
}

// List is Objects, with the folder's markers besides: it returns the same
// errors (ErrEmpty too: a folder of markers only is not a folder to load).
func (s *Source) List(ctx context.Context) (Listing, error) {
	if s.Folder.Scheme == SchemeFile {
		// fileblob's listing skips directories it cannot read, which would
		// make an unreadable folder look empty (or smaller than it is).
		if err := readableTree("/" + s.Folder.Prefix); err != nil {
			return Listing{}, fmt.Errorf("listing %s: %w", s.Folder, err)
		}
	}
	var l Listing
	encoded := false // set once S3 was asked for URL-encoded keys
	it := s.bucket.List(&blob.ListOptions{Prefix: s.keyPrefix, BeforeList: func(as func(any) bool) error {
		var in *s3.ListObjectsV2Input
		if as(&in) {
			in.EncodingType = s3types.EncodingTypeUrl
			encoded = true
		}
		return nil
	}})
	for {
		o, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if s.Folder.Scheme == SchemeS3 && IsNotFound(err) {
				return Listing{}, fmt.Errorf("listing %s: bucket %q does not exist (or is not visible to these credentials): %w", s.Folder, s.Folder.Bucket, err)
			}
			return Listing{}, fmt.Errorf("listing %s: %w", s.Folder, err)
		}
		key := o.Key
		if encoded {
			key, err = listedKey(o)
		} else {
			err = CheckKey(key)
		}
		if err != nil {
			return Listing{}, fmt.Errorf("listing %s: %w", s.Folder, err)
		}
		if o.IsDir {
			continue
		}
		if rel := strings.TrimPrefix(key, s.keyPrefix); IsMarker(rel) {
			l.Markers = append(l.Markers, Object{Key: rel, Size: o.Size, ETag: etagOf(o), LastModified: o.ModTime})
			continue
		}
		format, ok := FormatOf(key)
		if !ok {
			return Listing{}, fmt.Errorf("%w: %s (want .csv, .ndjson or .jsonl; markers start with _ or .)", ErrUnsupportedObject, key)
		}
		l.Objects = append(l.Objects, Object{Key: key, Size: o.Size, Format: format, ETag: etagOf(o), LastModified: o.ModTime})
	}
	if len(l.Objects) == 0 {
		return l, fmt.Errorf("%w: %s", ErrEmpty, s.Folder)
	}
	sort.Slice(l.Objects, func(i, j int) bool { return l.Objects[i].Key < l.Objects[j].Key })
	sort.Slice(l.Markers, func(i, j int) bool { return l.Markers[i].Key < l.Markers[j].Key })
	return l, nil
}

// etagOf returns the listed object's ETag: S3's, unquoted, or the hex MD5
// other stores report.
func etagOf(o *blob.ListObject) string {
	var raw s3types.Object
	if o.As(&raw) && raw.ETag != nil {
		return strings.Trim(aws.ToString(raw.ETag), `"`)
	}
	if len(o.MD5) > 0 {
		return hex.EncodeToString(o.MD5)
	}
	return ""
}

// listedKey decodes the key of an object of a URL-encoded S3 listing and
// returns it as gocloud names it, the name Records reads it by. It refuses,
// wrapping ErrUnreadableKey, a key that does not decode or CheckKey
// refuses, and a key that gocloud names differently from S3 (s3blob
// unescapes "__0x2f__"-like sequences in listed keys and escapes ASCII
// 0–31 in the keys it reads): a read by that name would be of another
// object, or of none.
func listedKey(o *blob.ListObject) (string, error) {
	var raw s3types.Object
	if !o.As(&raw) {
		return "", fmt.Errorf("%w: %s is not an S3 listing's object", ErrUnreadableKey, strconv.Quote(o.Key))
	}
	key, err := DecodeListedKey(aws.ToString(raw.Key))
	if err != nil {
		return "", err
	}
	if err := CheckKey(key); err != nil {
		return "", err
	}
	// o.Key is gocloud's unescaping of the encoded key; the encoding
	// leaves its escapes (letters, digits, "_") as they are.
	named, err := DecodeListedKey(o.Key)
	if err != nil || named != key {
		return "", fmt.Errorf("%w: %s holds an escape of gocloud.dev/blob (__0x…__), so it would be read as another key", ErrUnreadableKey, strconv.Quote(key))
	}
	return key, nil
}

// FullKey returns the object's key as recorded with its records: the key in
// the bucket, or the absolute path for file folders.
func (s *Source) FullKey(o Object) string {
	if s.Folder.Scheme == SchemeFile {
		return "/" + s.Folder.Prefix + "/" + o.Key
	}
	return o.Key
}

// readableTree walks the directory tree under root and returns the first
// directory it cannot read.
func readableTree(root string) error {
	return filepath.WalkDir(root, func(_ string, _ fs.DirEntry, err error) error { return err })
}

// IsNotFound reports whether a storage error means the object or bucket
// does not exist.
func IsNotFound(err error) bool { return gcerrors.Code(err) == gcerrors.NotFound }

// IsTransient reports whether a storage error may succeed if retried, by
// the portable blob error codes (throttling, timeouts, server errors) and a
// process or system out of file descriptors. AWS errors (S3's 503 SlowDown,
// 5xx) are classified by pipeline.IsTransient, which sees through the blob
// wrapping.
func IsTransient(err error) bool {
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		return true
	}
	switch gcerrors.Code(err) {
	case gcerrors.DeadlineExceeded, gcerrors.ResourceExhausted, gcerrors.Internal:
		return true
	}
	return false
}
