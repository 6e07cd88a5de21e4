package folder

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"time"
)

// BenchmarkValueCheck compares, record by record, the parse alone
// (json.Valid, which every NDJSON record costs) with the parse and the
// check of its values (checkValues, without and with a RefuseNumber like
// the Redshift warehouse's), over ordinary records and records whose
// numbers are written with exponents (every one of them parsed). Each
// iteration times the three over the same 1,000 records one after the
// other, and the fastest time of each is kept, so a machine shared with
// other work slows them alike: values/parse and double/parse are the
// ratios of the check with the parse to the parse alone (go test -run '^$'
// -bench ValueCheck -benchtime 2000x ./internal/folder).
func BenchmarkValueCheck(b *testing.B) {
	refuse := func(n []byte) string {
		if _, err := strconv.ParseFloat(string(n), 64); err != nil {
			return err.Error()
		}
		return ""
	}
	for _, c := range []struct {
		name  string
		lines [][]byte
	}{
		{"ndjson", bytes.Split(bytes.TrimSpace([]byte(benchRecords(1000, false))), []byte("\n"))},
		{"ndjson-exponents", bytes.Split(bytes.TrimSpace([]byte(benchRecords(1000, true))), []byte("\n"))},
	} {
		b.Run(c.name, func(b *testing.B) {
			size := 0
			for _, l := range c.lines {
				size += len(l)
			}
			variants := []func([]byte) bool{
				json.Valid,
				func(l []byte) bool {
					_, bad := checkValues(l, nil)
					return json.Valid(l) && !bad
				},
				func(l []byte) bool {
					_, bad := checkValues(l, refuse)
					return json.Valid(l) && !bad
				},
			}
			fastest := make([]time.Duration, len(variants))
			b.SetBytes(int64(size))
			for b.Loop() {
				for i, check := range variants {
					start := time.Now()
					for _, l := range c.lines {
						if !check(l) {
							b.Fatal("refused", string(l))
						}
					}
					if d := time.Since(start); fastest[i] == 0 || d < fastest[i] {
						fastest[i] = d
					}
				}
			}
			b.ReportMetric(float64(fastest[0].Nanoseconds())/float64(len(c.lines)), "parse-ns/record")
			b.ReportMetric(float64(fastest[1])/float64(fastest[0]), "values/parse")
			b.ReportMetric(float64(fastest[2])/float64(fastest[0]), "double/parse")
		})
	}
}
