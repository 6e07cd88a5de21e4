package folder

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// benchRecords returns n NDJSON records as fleet devices send them, their
// numbers written with exponents when exp is set.
func benchRecords(n int, exp bool) string {
	var b strings.Builder
	for i := range n {
		if exp {
			fmt.Fprintf(&b, `{"device_id":"dev-%06d","ts":"2026-12-06T02:55:%02dZ","temp":%.4e,"humidity":%.3e,"ok":true,"tags":["a","bb"],"loc":{"lat":%.5e,"lon":%.5e}}`+"\n",
				i, i%60, 21.375+float64(i%7), float64(40+i%20), 52.52+float64(i%5)/100, 13.405)
			continue
		}
		fmt.Fprintf(&b, `{"device_id":"dev-%06d","ts":"2026-12-06T02:55:%02dZ","temp":%.3f,"humidity":%d,"ok":true,"tags":["a","bb"],"loc":{"lat":%.4f,"lon":%.3f}}`+"\n",
			i, i%60, 21.375+float64(i%7), 40+i%20, 52.52+float64(i%5)/100, 13.405)
	}
	return b.String()
}

// benchCSV returns n CSV records under a header, as fleet devices send them.
func benchCSV(n int) string {
	var b strings.Builder
	b.WriteString("device_id,ts,temp,humidity,ok,note\n")
	for i := range n {
		fmt.Fprintf(&b, "dev-%06d,2026-12-06T02:55:%02dZ,%.3f,%d,true,\"plain, quoted\"\n", i, i%60, 21.375+float64(i%7), 40+i%20)
	}
	return b.String()
}

// BenchmarkRead reads a folder of 10,000 records through the record
// reader, every check included: compare it across commits to see what a
// check costs a whole read (go test -run '^$' -bench 'Read$' -count 5).
// Beside the time, it reports the process's CPU time per read (cpu-ns/op,
// user and system, the garbage collector's included), which a machine
// busy with other work inflates far less than the time.
func BenchmarkRead(b *testing.B) {
	for _, c := range []struct {
		name, file, body string
	}{
		{"ndjson", "f/a.ndjson", benchRecords(10_000, false)},
		{"ndjson-exponents", "f/a.ndjson", benchRecords(10_000, true)},
		{"csv", "f/a.csv", benchCSV(10_000)},
	} {
		b.Run(c.name, func(b *testing.B) {
			bucket := "bench-read-" + c.name
			if err := MemBucket(bucket).WriteAll(context.Background(), c.file, []byte(c.body), nil); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			f, err := Canonicalize("mem://" + bucket + "/f")
			if err != nil {
				b.Fatal(err)
			}
			src, err := Opener{}.Open(ctx, f)
			if err != nil {
				b.Fatal(err)
			}
			defer src.Close()
			objs, err := src.Objects(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				rr := src.Records(ctx, objs)
				n := 0
				for rr.Next() {
					n++
				}
				if err := rr.Err(); err != nil || n != 10_000 {
					b.Fatal(n, err)
				}
				rr.Close()
			}
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU returns the user and system CPU time of the process so far.
func processCPU() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
