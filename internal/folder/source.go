package folder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

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
// default credential chain and region (AWS_REGION), file:// on the local
// file system, and mem:// as process-wide named in-memory buckets that tests
// and the demo can fill with MemBucket. Its Limits bound the records read
// from what it opens.
type Opener struct {
	Limits Limits
}

// Open returns a Source reading f.
func (o Opener) Open(ctx context.Context, f Folder) (*Source, error) {
	s := &Source{Folder: f, keyPrefix: f.Prefix + "/", limits: o.Limits}
	var err error
	switch f.Scheme {
	case SchemeS3:
		s.bucket, err = blob.OpenBucket(ctx, "s3://"+f.Bucket)
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
// marker, and the storage error when the folder cannot be listed.
func (s *Source) Objects(ctx context.Context) ([]Object, error) {
	if s.Folder.Scheme == SchemeFile {
		// fileblob's listing skips directories it cannot read, which would
		// make an unreadable folder look empty (or smaller than it is).
		if err := readableTree("/" + s.Folder.Prefix); err != nil {
			return nil, fmt.Errorf("listing %s: %w", s.Folder, err)
		}
	}
	var objects []Object
	it := s.bucket.List(&blob.ListOptions{Prefix: s.keyPrefix})
	for {
		o, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if s.Folder.Scheme == SchemeS3 && IsNotFound(err) {
				return nil, fmt.Errorf("listing %s: bucket %q does not exist (or is not visible to these credentials): %w", s.Folder, s.Folder.Bucket, err)
			}
			return nil, fmt.Errorf("listing %s: %w", s.Folder, err)
		}
		if o.IsDir || IsMarker(strings.TrimPrefix(o.Key, s.keyPrefix)) {
			continue
		}
		format, ok := FormatOf(o.Key)
		if !ok {
			return nil, fmt.Errorf("%w: %s (want .csv, .ndjson or .jsonl; markers start with _ or .)", ErrUnsupportedObject, o.Key)
		}
		objects = append(objects, Object{Key: o.Key, Size: o.Size, Format: format})
	}
	if len(objects) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrEmpty, s.Folder)
	}
	sort.Slice(objects, func(i, j int) bool { return objects[i].Key < objects[j].Key })
	return objects, nil
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
