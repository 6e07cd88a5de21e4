package folder

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
)

// BenchmarkValueCheck compares, record by record, the parse alone
// (json.Valid, which every NDJSON record costs) with the parse and the
// check of its values (checkValues, without and with a RefuseNumber like
// the Redshift warehouse's), over ordinary records and records whose
// numbers are written with exponents (every one of them parsed).
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
		size := 0
		for _, l := range c.lines {
			size += len(l)
		}
		run := func(name string, check func([]byte) bool) {
			b.Run(c.name+"/"+name, func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					for _, l := range c.lines {
						if !check(l) {
							b.Fatal("refused", string(l))
						}
					}
				}
			})
		}
		run("parse", json.Valid)
		run("parse+values", func(l []byte) bool {
			_, bad := checkValues(l, nil)
			return json.Valid(l) && !bad
		})
		run("parse+values+double", func(l []byte) bool {
			_, bad := checkValues(l, refuse)
			return json.Valid(l) && !bad
		})
	}
}
