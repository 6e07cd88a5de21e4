package s3test_test

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/s3test"
)

// TestMultipartUploadThroughTheTransferManager proves the server takes a
// streamed multipart upload from the SDK's transfer manager intact.
func TestMultipartUploadThroughTheTransferManager(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := s3test.Start(t)
	srv.CreateBucket(t, "mpart")
	body := make([]byte, 12<<20) // three 5 MiB parts, the last one short
	r := rand.New(rand.NewPCG(1, 2))
	for i := range body {
		body[i] = byte(r.IntN(256))
	}
	tm := transfermanager.New(srv.Client(), func(o *transfermanager.Options) {
		o.PartSizeBytes = 5 << 20
		o.MultipartUploadThreshold = 5 << 20
		o.Concurrency = 2
	})
	_, err := tm.UploadObject(ctx, &transfermanager.UploadObjectInput{
		Bucket: aws.String("mpart"), Key: aws.String("big.bin"), Body: io.NopCloser(bytes.NewReader(body)),
	})
	require.NoError(t, err)
	require.Equal(t, 1, srv.Requests("mpart", "CreateMultipartUpload"))
	require.Equal(t, 3, srv.Requests("mpart", "UploadPart"))
	require.Equal(t, 1, srv.Requests("mpart", "CompleteMultipartUpload"))

	out, err := srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("mpart"), Key: aws.String("big.bin")})
	require.NoError(t, err)
	got, err := io.ReadAll(out.Body)
	require.NoError(t, err)
	require.True(t, bytes.Equal(body, got), "the object reads back as written")
}

// TestThrottleAnswersSlowDown proves injected throttling reaches the SDK as
// S3's SlowDown error once the SDK's own retries are spent.
func TestThrottleAnswersSlowDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := s3test.Start(t)
	srv.CreateBucket(t, "slow")
	srv.Put(t, "slow", "k", []byte("v"))
	srv.Throttle("slow", 100)
	_, err := srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("slow"), Key: aws.String("k")},
		func(o *s3.Options) { o.RetryMaxAttempts = 2 })
	var apiErr smithy.APIError
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, "SlowDown", apiErr.ErrorCode())
	require.Equal(t, 2, srv.Requests("slow", "GetObject"))

	srv.Throttle("slow", 0)
	_, err = srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("slow"), Key: aws.String("k")})
	require.NoError(t, err)
}

// TestSlowDelaysObjectReads proves Slow delays each object read, not the
// listing, and that Reads counts the reads of each object.
func TestSlowDelaysObjectReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := s3test.Start(t)
	srv.CreateBucket(t, "lazy")
	srv.Put(t, "lazy", "a/k", []byte("v"))
	srv.Slow("lazy", 300*time.Millisecond)

	start := time.Now()
	_, err := srv.Client().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("lazy")})
	require.NoError(t, err)
	require.Less(t, time.Since(start), 300*time.Millisecond, "listings are not delayed")

	for range 2 {
		start = time.Now()
		out, err := srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("lazy"), Key: aws.String("a/k")})
		require.NoError(t, err)
		out.Body.Close()
		require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	}
	require.Equal(t, 2, srv.Reads("lazy", "a/k"))
	require.Zero(t, srv.Reads("lazy", "other"))
}

// TestSlowListingDelaysListPages: SlowListing delays each listing page, not
// object reads.
func TestSlowListingDelaysListPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := s3test.Start(t)
	srv.CreateBucket(t, "paged")
	srv.Put(t, "paged", "a/k", []byte("v"))
	srv.SlowListing("paged", 200*time.Millisecond)
	start := time.Now()
	_, err := srv.Client().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("paged")})
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	start = time.Now()
	out, err := srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("paged"), Key: aws.String("a/k")})
	require.NoError(t, err)
	out.Body.Close()
	require.Less(t, time.Since(start), 200*time.Millisecond, "object reads are not delayed")
}

// TestListingOfAControlCharacterKeyNeedsURLEncoding reproduces, on the
// test server, what S3 does with a key holding U+0001: a ListObjectsV2
// page without EncodingType cannot be decoded by the SDK (the key is a
// character reference XML 1.0 does not allow), while with EncodingType url
// the SDK hands back the key URL-encoded — it does not decode it — and
// url.QueryUnescape gives the exact key back. Prefix, StartAfter and
// Delimiter are echoed encoded too, and paging visits every key once.
func TestListingOfAControlCharacterKeyNeedsURLEncoding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := s3test.Start(t)
	srv.CreateBucket(t, "keys")
	keys := []string{
		"tenants/a/a b+c%d.csv",
		"tenants/a/x\x01y.csv",
		"tenants/a/\u00e9t\u00e9 (1).csv",
		"tenants/b/ok.csv",
	}
	for _, k := range keys {
		srv.Put(t, "keys", k, []byte("v"))
	}
	client := srv.Client()

	// The bug: the page holding the key is undecodable; a page without it
	// is not.
	_, err := client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("keys")})
	require.ErrorContains(t, err, "illegal character code U+0001")
	_, err = client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("keys"), Prefix: aws.String("tenants/b/")})
	require.NoError(t, err)

	// The fix: URL-encoded keys, decoded by the caller.
	out, err := client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{
		Bucket: aws.String("keys"), Prefix: aws.String("tenants/a/"), StartAfter: aws.String("tenants/a/ +"),
		EncodingType: types.EncodingTypeUrl,
	})
	require.NoError(t, err)
	require.Equal(t, types.EncodingTypeUrl, out.EncodingType)
	require.Equal(t, "tenants/a/+%2B", aws.ToString(out.StartAfter), "the SDK does not decode the echo")
	require.Equal(t, "tenants/a/", aws.ToString(out.Prefix))
	var raw, decoded []string
	for _, o := range out.Contents {
		raw = append(raw, aws.ToString(o.Key))
		k, err := url.QueryUnescape(aws.ToString(o.Key))
		require.NoError(t, err)
		decoded = append(decoded, k)
	}
	require.Equal(t, []string{"tenants/a/a+b%2Bc%25d.csv", "tenants/a/x%01y.csv", "tenants/a/%C3%A9t%C3%A9+%281%29.csv"}, raw,
		"the SDK hands the keys back as S3 encoded them")
	require.Equal(t, keys[:3], decoded)

	// Delimiter and common prefixes are encoded the same way.
	out, err = client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{
		Bucket: aws.String("keys"), Delimiter: aws.String("x\x01"), EncodingType: types.EncodingTypeUrl,
	})
	require.NoError(t, err)
	require.Equal(t, "x%01", aws.ToString(out.Delimiter))
	require.Len(t, out.CommonPrefixes, 1)
	require.Equal(t, "tenants/a/x%01", aws.ToString(out.CommonPrefixes[0].Prefix))

	// Paging, one key a page: every key once, in order.
	var all []string
	pages := s3.NewListObjectsV2Paginator(client, &s3.ListObjectsV2Input{
		Bucket: aws.String("keys"), MaxKeys: aws.Int32(1), EncodingType: types.EncodingTypeUrl,
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		require.NoError(t, err)
		for _, o := range page.Contents {
			k, err := url.QueryUnescape(aws.ToString(o.Key))
			require.NoError(t, err)
			all = append(all, k)
		}
	}
	want := slices.Clone(keys)
	slices.Sort(want)
	require.Equal(t, want, all)

	// An encoding S3 does not know is refused.
	_, err = client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("keys"), EncodingType: "base64"})
	var apiErr smithy.APIError
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, "InvalidArgument", apiErr.ErrorCode())
	// A bucket that does not exist is still gofakes3's NoSuchBucket.
	_, err = client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("no-such-keys"), EncodingType: types.EncodingTypeUrl})
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, "NoSuchBucket", apiErr.ErrorCode())
}
