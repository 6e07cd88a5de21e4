package s3test_test

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/s3test"
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
