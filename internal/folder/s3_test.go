package folder_test

import (
	"context"
	"crypto/md5"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/s3test"
)

// s3srv is the S3-compatible server every s3:// folder of these tests lives
// on; TestMain points the AWS SDK at it through AWS_ENDPOINT_URL_S3, exactly
// as a deployment would point it at S3.
var s3srv *s3test.Server

func TestMain(m *testing.M) {
	s3srv = s3test.New()
	s3srv.SetEnv()
	code := m.Run()
	s3srv.Close()
	os.Exit(code)
}

func openS3(t *testing.T, url string) *folder.Source {
	t.Helper()
	f, err := folder.Canonicalize(url)
	require.NoError(t, err)
	src, err := folder.Opener{}.Open(context.Background(), f)
	require.NoError(t, err)
	t.Cleanup(func() { src.Close() })
	return src
}

// TestS3FolderOfMoreThanAThousandObjects lists past S3's 1,000-key page.
func TestS3FolderOfMoreThanAThousandObjects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 1_050
	s3srv.CreateBucket(t, "paginated")
	client := s3srv.Client()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			_, err := client.PutObject(ctx, &s3.PutObjectInput{
				Bucket: aws.String("paginated"), Key: aws.String(fmt.Sprintf("tenants/t1/up/part-%05d.csv", i)),
				Body: strings.NewReader(fmt.Sprintf("id,seq\nrow-%d,%d\n", i, i)),
			})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	s3srv.Put(t, "paginated", "tenants/t1/up/_SUCCESS", nil)
	s3srv.Put(t, "paginated", "tenants/t1/upper/not-this-folder.csv", []byte("id\nx\n"))

	src := openS3(t, "s3://paginated/tenants/t1/up")
	objs, err := src.Objects(ctx)
	require.NoError(t, err)
	require.Len(t, objs, n)
	for i, o := range objs {
		require.Equal(t, fmt.Sprintf("tenants/t1/up/part-%05d.csv", i), o.Key)
	}
	require.GreaterOrEqual(t, s3srv.Requests("paginated", "ListObjectsV2"), 2, "more than one page was listed")

	rr := src.Records(ctx, objs)
	defer rr.Close()
	var last folder.Record
	for rr.Next() {
		last = rr.Record()
	}
	require.NoError(t, rr.Err())
	require.Equal(t, int64(n), rr.Count())
	require.Equal(t, "tenants/t1/up/part-01049.csv", last.ObjectKey)
	require.JSONEq(t, `{"id":"row-1049","seq":"1049"}`, string(last.JSON))
}

// TestS3MissingBucketIsTerminal: a folder in a bucket that does not exist
// fails with an error naming the bucket, which is not retried.
func TestS3MissingBucketIsTerminal(t *testing.T) {
	t.Parallel()
	src := openS3(t, "s3://no-such-bucket/tenants/t1/up")
	_, err := src.Objects(context.Background())
	require.Error(t, err)
	require.True(t, folder.IsNotFound(err), "%v", err)
	require.Contains(t, err.Error(), `bucket "no-such-bucket" does not exist`)
	require.False(t, pipeline.IsTransient(err), "a missing bucket is terminal: %v", err)
}

// TestS3SlowDownIsTransient: S3 throttling that outlasts the SDK's own
// retries is transient; once S3 answers again, the folder reads.
func TestS3SlowDownIsTransient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s3srv.CreateBucket(t, "throttled")
	s3srv.Put(t, "throttled", "up/a.ndjson", []byte(`{"id":1}`+"\n"))
	src := openS3(t, "s3://throttled/up")

	s3srv.Throttle("throttled", 1_000)
	_, err := src.Objects(ctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), "SlowDown")
	require.True(t, pipeline.IsTransient(err), "throttling is transient: %v", err)
	require.False(t, folder.IsNotFound(err))

	s3srv.Throttle("throttled", 0)
	objs, err := src.Objects(ctx)
	require.NoError(t, err)
	s3srv.Throttle("throttled", 1_000)
	rr := src.Records(ctx, objs)
	require.False(t, rr.Next())
	require.True(t, pipeline.IsTransient(rr.Err()), "a throttled read is transient: %v", rr.Err())
	require.NoError(t, rr.Close())
}

// TestS3FolderWithAControlCharacterKey: S3 is asked for URL-encoded keys,
// so a key holding U+0001 fails its own folder's listing with an error
// that names it escaped and is not retried — instead of an undecodable
// listing page — while another folder of the same bucket lists and reads,
// keys with a space, "+", "%" and non-ASCII characters exactly. A key
// gocloud would read as another (its __0x…__ escapes) is refused too.
func TestS3FolderWithAControlCharacterKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s3srv.CreateBucket(t, "ctl-keys")
	s3srv.Put(t, "ctl-keys", "tenants/t1/up/part\x01.csv", []byte("id\n1\n"))
	s3srv.Put(t, "ctl-keys", "tenants/t1/up/a.csv", []byte("id\n1\n"))
	s3srv.Put(t, "ctl-keys", "tenants/t1/up/_SUCCESS", nil)
	odd := []string{"tenants/t2/up/a b+c%41.csv", "tenants/t2/up/\u00e9t\u00e9 (1).ndjson"}
	s3srv.Put(t, "ctl-keys", odd[0], []byte("id\nspace-plus-percent\n"))
	s3srv.Put(t, "ctl-keys", odd[1], []byte(`{"id":"accents"}`+"\n"))
	s3srv.Put(t, "ctl-keys", "tenants/t3/up/a__0x41__.csv", []byte("id\n1\n"))
	s3srv.Put(t, "ctl-keys", "tenants/t3/up/aA.csv", []byte("id\nnot-this-one\n"))

	_, err := openS3(t, "s3://ctl-keys/tenants/t1/up").Objects(ctx)
	require.ErrorIs(t, err, folder.ErrUnreadableKey)
	require.ErrorContains(t, err, `"tenants/t1/up/part\x01.csv" holds a control character (U+0001)`)
	require.False(t, pipeline.IsTransient(err), "%v", err)

	src := openS3(t, "s3://ctl-keys/tenants/t2/up")
	objs, err := src.Objects(ctx)
	require.NoError(t, err)
	require.Len(t, objs, 2)
	require.Equal(t, odd, []string{objs[0].Key, objs[1].Key})
	rr := src.Records(ctx, objs)
	defer rr.Close()
	var got []string
	for rr.Next() {
		got = append(got, rr.Record().ObjectKey+" "+string(rr.Record().JSON))
	}
	require.NoError(t, rr.Err())
	require.Equal(t, []string{odd[0] + ` {"id":"space-plus-percent"}`, odd[1] + ` {"id":"accents"}`}, got)

	_, err = openS3(t, "s3://ctl-keys/tenants/t3/up").Objects(ctx)
	require.ErrorIs(t, err, folder.ErrUnreadableKey)
	require.ErrorContains(t, err, `"tenants/t3/up/a__0x41__.csv" holds an escape of gocloud.dev/blob`)
}

// TestListingNamesEveryObjectsETagAndTimeAndTheMarkers: a folder's listing
// gives each data object's ETag (S3's, without quotes: the MD5 of a
// single-part upload) and last-modified time, and the markers beside the
// data, on S3 and on an in-memory bucket alike.
func TestListingNamesEveryObjectsETagAndTimeAndTheMarkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	body := []byte("id,seq\nr1,1\n")
	sum := fmt.Sprintf("%x", md5.Sum(body))

	s3srv.CreateBucket(t, "listing-etags")
	s3srv.Put(t, "listing-etags", "tenants/t1/up/part-1.csv", body)
	s3srv.Put(t, "listing-etags", "tenants/t1/up/part-2.csv", []byte("id,seq\nr2,2\n"))
	s3srv.Put(t, "listing-etags", "tenants/t1/up/_SUCCESS", nil)
	mem := folder.MemBucket("listing-etags")
	require.NoError(t, mem.WriteAll(ctx, "tenants/t1/up/part-1.csv", body, nil))
	require.NoError(t, mem.WriteAll(ctx, "tenants/t1/up/part-2.csv", []byte("id,seq\nr2,2\n"), nil))
	require.NoError(t, mem.WriteAll(ctx, "tenants/t1/up/_SUCCESS", nil, nil))

	for _, url := range []string{"s3://listing-etags/tenants/t1/up", "mem://listing-etags/tenants/t1/up"} {
		t.Run(url[:strings.Index(url, ":")], func(t *testing.T) {
			l, err := openS3(t, url).List(ctx)
			require.NoError(t, err)
			require.Len(t, l.Objects, 2)
			require.Equal(t, "tenants/t1/up/part-1.csv", l.Objects[0].Key)
			require.Equal(t, sum, l.Objects[0].ETag)
			require.NotEqual(t, l.Objects[0].ETag, l.Objects[1].ETag)
			for _, o := range l.Objects {
				require.WithinDuration(t, time.Now(), o.LastModified, time.Hour, o.Key)
			}
			m, ok := l.Marker("_SUCCESS")
			require.True(t, ok, "the marker is listed: %+v", l.Markers)
			require.WithinDuration(t, time.Now(), m.LastModified, time.Hour)
			_, ok = l.Marker("_DONE")
			require.False(t, ok)
		})
	}
}
