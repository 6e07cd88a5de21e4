package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/klauspost/compress/gzip"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
)

// errStaged stops a load at its lease check, when staging is complete.
var errStaged = errors.New("staged")

// benchStaging measures the Redshift warehouse's staging: reading a folder
// of CSV rows, turning them into curated NDJSON rows, compressing them with
// gzip and uploading the parts (multipart) and the manifest to an in-process
// S3 server. The baseline is gzip -c of the very NDJSON staged, on the same
// machine: the figure is uncompressed NDJSON MB/s, ours over gzip's.
func benchStaging(e *env) error {
	const rows = 200_000
	dir := filepath.Join(e.dir, "staging")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var src strings.Builder
	src.WriteString("vehicle_id,recorded_at,latitude,longitude,speed_kmh,odometer_km,driver,status\n")
	for i := range rows {
		fmt.Fprintf(&src, "VH-%07d,2026-11-30T10:%02d:%02dZ,52.%06d,13.%06d,%d,%d,driver-%05d,moving\n",
			i, i%60, (i/60)%60, i%1000000, (i*7)%1000000, i%130, 100000+i, i%50000)
	}
	if err := os.WriteFile(filepath.Join(dir, "part-0.csv"), []byte(src.String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "_SUCCESS"), nil, 0o644); err != nil { // the completion marker the worker requires
		return err
	}

	srv := s3test.New()
	defer srv.Close()
	if _, err := srv.Client().CreateBucket(e.ctx, &s3.CreateBucketInput{Bucket: aws.String("bench-staging")}); err != nil {
		return err
	}
	admin, err := pgxpool.New(e.ctx, e.cluster.URL("postgres"))
	if err != nil {
		return err
	}
	_, err = admin.Exec(e.ctx, `CREATE DATABASE bench_redshift`)
	admin.Close()
	if err != nil {
		return err
	}
	double, err := redshifttest.New(redshifttest.Options{DatabaseURL: e.cluster.URL("bench_redshift"), S3: srv.Client()})
	if err != nil {
		return err
	}
	defer double.Close()
	cfg := redshift.Config{WorkgroupName: "bench", Database: "dev", IAMRole: "default", Staging: "s3://bench-staging/fleet/",
		PollInterval: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	wh, err := redshift.New(cfg, double.Client(), srv.Client())
	if err != nil {
		return err
	}
	if _, err := wh.Migrate(e.ctx); err != nil {
		return err
	}
	f, err := folder.Canonicalize("file://" + dir)
	if err != nil {
		return err
	}
	source, err := folder.Opener{}.Open(e.ctx, f)
	if err != nil {
		return err
	}
	defer source.Close()
	objs, err := source.Objects(e.ctx)
	if err != nil {
		return err
	}

	ndjson := filepath.Join(e.dir, "staged.ndjson")
	var (
		fastest         time.Duration
		raw, compressed int64
		stagedRows      int64
		generation      int64
	)
	for range 3 {
		generation++
		start := time.Now()
		var took time.Duration
		_, err := wh.Load(e.ctx, warehouse.Slice{TenantID: "tenant-bench", SourceScope: f.Scope(), BatchID: 1, Generation: generation}, source, objs,
			func(ctx context.Context) error {
				took = time.Since(start)
				if generation == 1 {
					stagedRows, raw, compressed, err = unstage(ctx, srv.Client(), fmt.Sprintf("fleet/batch-1/gen-%d/manifest.json", generation), ndjson)
					if err != nil {
						return err
					}
				}
				return errStaged
			})
		if !errors.Is(err, errStaged) {
			return fmt.Errorf("staging: %v", err)
		}
		if fastest == 0 || took < fastest {
			fastest = took
		}
	}
	if stagedRows != rows {
		return fmt.Errorf("staged %d rows, want %d", stagedRows, rows)
	}

	var gzipBest time.Duration
	for range 3 {
		in, err := os.Open(ndjson)
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(e.ctx, "gzip", "-c")
		cmd.Stdin, cmd.Stdout = in, io.Discard
		start := time.Now()
		err = cmd.Run()
		took := time.Since(start)
		in.Close()
		if err != nil {
			return fmt.Errorf("gzip -c: %w", err)
		}
		if gzipBest == 0 || took < gzipBest {
			gzipBest = took
		}
	}
	mb := float64(raw) / 1e6
	e.add("staging, 200,000 rows to gzip NDJSON parts in S3", mb/fastest.Seconds(), ptr(mb/gzipBest.Seconds()), "MB/s NDJSON", 0.5, false,
		fmt.Sprintf("best of 3; ours reads the CSV, builds the curated rows, gzips (klauspost, level 6) and uploads parts and manifest to an in-process S3 server: %.0f rows/s, %.1f MB NDJSON, %.1f MB gzip (%.1f MB/s written); baseline: gzip -c of the same NDJSON",
			float64(rows)/fastest.Seconds(), mb, float64(compressed)/1e6, float64(compressed)/1e6/fastest.Seconds()))
	e.add("staging rows", float64(rows)/fastest.Seconds(), nil, "rows/s", 0, false, "the same runs, in rows per second")
	return nil
}

// unstage streams the parts a manifest names back into one NDJSON file and
// returns its lines, bytes and the compressed size.
func unstage(ctx context.Context, client *s3.Client, manifestKey, path string) (lines, raw, compressed int64, err error) {
	out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("bench-staging"), Key: aws.String(manifestKey)})
	if err != nil {
		return 0, 0, 0, err
	}
	var man redshift.Manifest
	err = json.NewDecoder(out.Body).Decode(&man)
	out.Body.Close()
	if err != nil {
		return 0, 0, 0, err
	}
	dst, err := os.Create(path)
	if err != nil {
		return 0, 0, 0, err
	}
	defer dst.Close()
	w := bufio.NewWriterSize(dst, 1<<20)
	for _, en := range man.Entries {
		part, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("bench-staging"), Key: aws.String(strings.TrimPrefix(en.URL, "s3://bench-staging/"))})
		if err != nil {
			return 0, 0, 0, err
		}
		compressed += en.Meta.ContentLength
		zr, err := gzip.NewReader(part.Body)
		if err != nil {
			part.Body.Close()
			return 0, 0, 0, err
		}
		sc := bufio.NewScanner(zr)
		sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
		for sc.Scan() {
			lines++
			raw += int64(len(sc.Bytes())) + 1
			w.Write(sc.Bytes())
			w.WriteByte('\n')
		}
		part.Body.Close()
		if err := sc.Err(); err != nil {
			return 0, 0, 0, err
		}
	}
	return lines, raw, compressed, w.Flush()
}
