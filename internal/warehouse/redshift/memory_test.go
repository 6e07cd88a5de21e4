package redshift_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/klauspost/compress/gzip"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
)

const (
	stagingRows = 1_000_000
	// stagingRSSBound is the bound the issue sets for staging a million
	// rows; the folder alone is about 78 MiB of CSV and its NDJSON about
	// 250 MiB, so holding either in memory fails it.
	stagingRSSBound = 64 << 20
)

// writeRowsFolder writes rows CSV rows of about 80 bytes over four files.
func writeRowsFolder(t testing.TB, rows int) string {
	t.Helper()
	dir := t.TempDir()
	const files = 4
	for f := range files {
		fh, err := os.Create(filepath.Join(dir, fmt.Sprintf("part-%d.csv", f)))
		require.NoError(t, err)
		w := bufio.NewWriterSize(fh, 1<<20)
		fmt.Fprintln(w, "vehicle_id,recorded_at,latitude,longitude,speed_kmh,odometer_km,driver,status")
		for i := f; i < rows; i += files {
			fmt.Fprintf(w, "VH-%07d,2026-11-30T10:%02d:%02dZ,52.%06d,13.%06d,%d,%d,driver-%05d,moving\n",
				i, i%60, (i/60)%60, i%1000000, (i*7)%1000000, i%130, 100000+i, i%50000)
		}
		require.NoError(t, w.Flush())
		require.NoError(t, fh.Close())
	}
	return "file://" + dir
}

// TestStagingAMillionRowsWithBoundedMemory stages a million rows in a
// separate process (a test binary built without the race detector) that
// reaches the S3 server and the Data API double of this process through
// the AWS environment, and checks its peak resident memory.
func TestStagingAMillionRowsWithBoundedMemory(t *testing.T) {
	t.Parallel()
	url := writeRowsFolder(t, stagingRows)
	srv := s3test.Start(t)
	srv.CreateBucket(t, stagingBucket)
	double := redshifttest.Start(t, redshifttest.Options{DatabaseURL: pgtest.EmptyDatabaseURL(t), S3: srv.Client(), Workgroup: testWorkgroup, Database: testDatabase})
	migrator, err := redshift.NewMigrator(testConfig(), double.Client())
	require.NoError(t, err)
	_, err = migrator.Migrate(context.Background())
	require.NoError(t, err)

	stager := testproc.NonRaceTestBinary(t)
	start := time.Now()
	cmd := exec.Command(stager, "-test.run=^TestStagingHelperProcess$", "-test.v")
	cmd.Env = append(append(append(os.Environ(), srv.Env()...), double.Env()...), "FLEET_STAGING_HELPER=1", "FLEET_STAGING_FOLDER="+url)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	elapsed := time.Since(start)
	peak := testproc.PeakRSS(t, out)
	var staged, raw, compressed, baseline int64
	for line := range strings.Lines(string(out)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "staged:"); ok {
			_, err := fmt.Sscanf(rest, "%d %d %d", &staged, &raw, &compressed)
			require.NoError(t, err)
		}
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "baseline-rss:"); ok {
			_, err := fmt.Sscanf(rest, "%d", &baseline)
			require.NoError(t, err)
		}
	}
	require.Equal(t, int64(stagingRows), staged, "every row was staged: %s", out)
	t.Logf("staged %d rows (%.1f MiB NDJSON, %.1f MiB gzip) in %s, stager peak RSS %.1f MiB (%.1f MiB before staging)",
		staged, float64(raw)/(1<<20), float64(compressed)/(1<<20), elapsed.Round(time.Millisecond), float64(peak)/(1<<20), float64(baseline)/(1<<20))
	require.Less(t, peak, int64(stagingRSSBound))
}

var errStaged = errors.New("staged: stop before the transaction")

// TestStagingHelperProcess is the stager of
// TestStagingAMillionRowsWithBoundedMemory; it does nothing on its own. It
// runs a Load up to its lease check, where the staging is complete, counts
// the staged lines by streaming them back, and stops.
func TestStagingHelperProcess(t *testing.T) {
	if os.Getenv("FLEET_STAGING_HELPER") != "1" {
		return
	}
	ctx := context.Background()
	if n, err := testproc.SelfPeakRSS(); err == nil {
		fmt.Printf("\nbaseline-rss: %d\n", n) // the test binary's own, before staging
	}
	cfg := testConfig()
	wh, err := redshift.Open(ctx, cfg)
	require.NoError(t, err)
	f, err := folder.Canonicalize(os.Getenv("FLEET_STAGING_FOLDER"))
	require.NoError(t, err)
	src, err := folder.Opener{}.Open(ctx, f)
	require.NoError(t, err)
	objs, err := src.Objects(ctx)
	require.NoError(t, err)
	awsCfg, err := config.LoadDefaultConfig(ctx)
	require.NoError(t, err)
	client := s3.NewFromConfig(awsCfg)
	var lines, raw, compressed int64
	_, err = wh.Load(ctx, warehouse.Slice{TenantID: "tenant-large", SourceScope: f.Scope(), BatchID: 1, Generation: 1}, src, objs,
		func(ctx context.Context) error {
			lines, raw, compressed = countStaged(t, ctx, client, "fleet/staging/batch-1/gen-1/manifest.json")
			return errStaged
		})
	require.ErrorIs(t, err, errStaged)
	fmt.Printf("\nstaged: %d %d %d\n", lines, raw, compressed)
	testproc.ReportPeakRSS(t)
}

// countStaged streams the parts a manifest names and counts their lines and
// bytes.
func countStaged(t *testing.T, ctx context.Context, client *s3.Client, manifestKey string) (lines, raw, compressed int64) {
	t.Helper()
	out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(stagingBucket), Key: aws.String(manifestKey)})
	require.NoError(t, err)
	var man redshift.Manifest
	require.NoError(t, json.NewDecoder(out.Body).Decode(&man))
	out.Body.Close()
	for _, e := range man.Entries {
		key := strings.TrimPrefix(e.URL, "s3://"+stagingBucket+"/")
		part, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(stagingBucket), Key: aws.String(key)})
		require.NoError(t, err)
		require.Equal(t, e.Meta.ContentLength, aws.ToInt64(part.ContentLength))
		compressed += e.Meta.ContentLength
		zr, err := gzip.NewReader(part.Body)
		require.NoError(t, err)
		r := bufio.NewReaderSize(zr, 1<<20)
		for {
			b, err := r.ReadSlice('\n')
			raw += int64(len(b))
			if len(b) > 0 && b[len(b)-1] == '\n' {
				lines++
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if err != nil {
				break
			}
		}
		part.Body.Close()
	}
	return lines, raw, compressed
}
