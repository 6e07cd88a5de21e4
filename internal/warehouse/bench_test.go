package warehouse_test

import (
	"bufio"
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
)

const benchRows = 200_000

// benchFolder writes a folder of benchRows CSV rows, and the same records
// as a CSV in the shape of curated.fleet_records for psql \copy.
func benchFolder(b *testing.B) (folderURL, copyFile string) {
	b.Helper()
	dir := b.TempDir()
	data := filepath.Join(dir, "folder")
	if err := os.MkdirAll(data, 0o755); err != nil {
		b.Fatal(err)
	}
	src, err := os.Create(filepath.Join(data, "part-0.csv"))
	if err != nil {
		b.Fatal(err)
	}
	copyFile = filepath.Join(dir, "records.csv")
	dst, err := os.Create(copyFile)
	if err != nil {
		b.Fatal(err)
	}
	sw, dw := bufio.NewWriter(src), csv.NewWriter(bufio.NewWriter(dst))
	fmt.Fprintln(sw, "vehicle_id,recorded_at,latitude,longitude,speed_kmh,odometer_km,driver,status")
	key := filepath.Join(data, "part-0.csv")
	for i := range benchRows {
		v := []string{fmt.Sprintf("VH-%07d", i), fmt.Sprintf("2026-11-30T10:%02d:%02dZ", i%60, (i/60)%60),
			fmt.Sprintf("52.%06d", i), fmt.Sprintf("13.%06d", (i*7)%1000000), strconv.Itoa(i % 130),
			strconv.Itoa(100000 + i), fmt.Sprintf("driver-%05d", i%50000), "moving"}
		fmt.Fprintf(sw, "%s,%s,%s,%s,%s,%s,%s,%s\n", v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])
		rec := fmt.Sprintf(`{"vehicle_id":%q,"recorded_at":%q,"latitude":%q,"longitude":%q,"speed_kmh":%q,"odometer_km":%q,"driver":%q,"status":%q}`,
			v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])
		if err := dw.Write([]string{"tenant-bench", "fleet_s3:file://" + data, "1", key, strconv.Itoa(i + 2), rec}); err != nil {
			b.Fatal(err)
		}
	}
	if err := sw.Flush(); err != nil {
		b.Fatal(err)
	}
	dw.Flush()
	if err := dw.Error(); err != nil {
		b.Fatal(err)
	}
	src.Close()
	dst.Close()
	return "file://" + data, copyFile
}

func truncate(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	if _, err := pool.Exec(context.Background(), `TRUNCATE curated.fleet_records, curated.fleet_slices`); err != nil {
		b.Fatal(err)
	}
}

// openBenchFolder opens the folder at url and lists its objects.
func openBenchFolder(b *testing.B, url string) (folder.Folder, *folder.Source, []folder.Object) {
	b.Helper()
	ctx := context.Background()
	f, err := folder.Canonicalize(url)
	if err != nil {
		b.Fatal(err)
	}
	src, err := folder.Opener{}.Open(ctx, f)
	if err != nil {
		b.Fatal(err)
	}
	objs, err := src.Objects(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return f, src, objs
}

// BenchmarkLoad measures Postgres.Load of a folder (read the CSV objects,
// convert rows to JSON, COPY, stamp, commit) in rows per second. Compare
// with BenchmarkBaselinePsqlCopy on the same data in the same run.
func BenchmarkLoad(b *testing.B) {
	ctx := context.Background()
	url, _ := benchFolder(b)
	pool := pgtest.NewPool(b)
	wh := warehouse.NewPostgres(pool)
	f, src, objs := openBenchFolder(b, url)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		truncate(b, pool)
		b.StartTimer()
		st, err := wh.Load(ctx, warehouse.Slice{TenantID: "tenant-bench", SourceScope: f.Scope(), BatchID: int64(i + 1), Generation: 1}, src, objs, nil)
		if err != nil || st.RecordCount != benchRows {
			b.Fatalf("load: %d %v", st.RecordCount, err)
		}
	}
	b.ReportMetric(float64(benchRows)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkBaselinePsqlCopy is the physical baseline of BenchmarkLoad: psql
// \copy of the same records, already in the table's shape, into the same
// table.
func BenchmarkBaselinePsqlCopy(b *testing.B) {
	if _, err := exec.LookPath("psql"); err != nil {
		b.Fatal("the baseline needs psql on PATH")
	}
	_, copyFile := benchFolder(b)
	dbURL := pgtest.NewDatabaseURL(b)
	pool := pgtest.Pool(b, dbURL)
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		truncate(b, pool)
		b.StartTimer()
		out, err := exec.Command("psql", dbURL, "-v", "ON_ERROR_STOP=1", "-c",
			`\copy curated.fleet_records (tenant_id, source_scope, batch_id, object_key, line_number, record) FROM '`+copyFile+`' CSV`).CombinedOutput()
		if err != nil {
			b.Fatalf("psql: %v: %s", err, out)
		}
	}
	b.ReportMetric(float64(benchRows)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkLoadTrivial measures Postgres.Load of a one-row folder, the
// trivial batch of the end-to-end benchmark: the cost of the load's round
// trips, not of its rows.
func BenchmarkLoadTrivial(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.csv"), []byte("k,v\n1,x\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	pool := pgtest.NewPool(b)
	wh := warehouse.NewPostgres(pool)
	f, src, objs := openBenchFolder(b, "file://"+dir)
	var before syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	for i := 0; b.Loop(); i++ {
		st, err := wh.Load(ctx, warehouse.Slice{TenantID: "tenant-bench", SourceScope: f.Scope(), BatchID: int64(i + 1), Generation: 1}, src, objs, nil)
		if err != nil || st.RecordCount != 1 {
			b.Fatalf("load: %d %v", st.RecordCount, err)
		}
	}
	var after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano()
	b.ReportMetric(float64(cpu)/1e3/float64(b.N), "client-cpu-µs/op")
}
