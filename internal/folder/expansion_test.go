package folder

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fleetCSV builds a CSV of rows rows from a header and a row function.
func fleetCSV(header string, rows int, row func(i int) string) string {
	var b strings.Builder
	b.WriteString(header + "\n")
	for i := range rows {
		b.WriteString(row(i) + "\n")
	}
	return b.String()
}

// ordinaryFleetCSVs are CSVs shaped as fleet trackers and exports write
// them: short column names, values from a digit to a timestamp, and many
// optional columns left empty.
var ordinaryFleetCSVs = map[string]string{
	"narrow telemetry": fleetCSV("vehicle_id,ts,lat,lon,speed", 1000, func(i int) string {
		return fmt.Sprintf("V-%04d,2026-03-01T12:%02d:%02dZ,52.%06d,13.%06d,%d", i%50, i/60%60, i%60, i*37%1000000, i*91%1000000, i%130)
	}),
	"compact telemetry": fleetCSV("vehicle_id,ts,lat,lon,speed", 1000, func(i int) string {
		return fmt.Sprintf("%d,%d,52,13,%d", i%9, 1767225600+i, i%10)
	}),
	"tracker export, optional fields empty": fleetCSV("vehicle_id,ts,lat,lon,speed,heading,odometer_km,fuel_pct,ignition,driver_id,dtc,trailer_id,door_open,temp_c,geofence,alert", 1000, func(i int) string {
		return fmt.Sprintf("V-%04d,2026-03-01T12:%02d:%02dZ,52.%06d,13.%06d,%d,%d,%d.%d,%d,true,,,,,,,", i%50, i/60%60, i%60, i*37%1000000, i*91%1000000, i%130, i%360, 100000+i, i%10, i%100)
	}),
	"heartbeats: all but the id empty": fleetCSV("vehicle_id,ts,lat,lon,speed,heading,odometer_km,fuel_pct,ignition,driver_id,dtc,trailer_id,door_open,temp_c,geofence,alert", 1000, func(i int) string {
		return fmt.Sprintf("%d,,,,,,,,,,,,,,,", i%9)
	}),
	"CAN signals: 300 columns, one in ten set": fleetCSV(func() string {
		names := make([]string, 300)
		for i := range names {
			names[i] = fmt.Sprintf("sig_%04d", i)
		}
		return strings.Join(names, ",")
	}(), 200, func(i int) string {
		vals := make([]string, 300)
		for j := range vals {
			if (i+j)%10 == 0 {
				vals[j] = fmt.Sprint((i * j) % 1000)
			}
		}
		return strings.Join(vals, ",")
	}),
	"long names, one-digit values": fleetCSV("vehicle_identification_number,odometer_reading_in_kilometres,engine_coolant_temperature_celsius", 1000, func(i int) string {
		return fmt.Sprintf("%d,%d,%d", i%10, i%7, i%5)
	}),
}

// TestOrdinaryFleetCSVsAreWithinTheExpansionBound: the default bound
// never refuses ordinary fleet data. It logs the largest ratio of JSON to
// CSV bytes each CSV reaches per record and per object, the figures the
// default was chosen from.
func TestOrdinaryFleetCSVsAreWithinTheExpansionBound(t *testing.T) {
	t.Parallel()
	var worstRecord, worstObject float64
	for name, csv := range ordinaryFleetCSVs {
		recs, err := readLimited(t, Limits{}, map[string]string{"f/a.csv": csv})
		require.NoError(t, err, name)
		rows := strings.Split(strings.TrimSuffix(csv, "\n"), "\n")[1:]
		require.Len(t, recs, len(rows), name)
		var record float64
		var total int
		for i, r := range recs {
			record = max(record, float64(len(r.JSON))/float64(len(rows[i])+1))
			total += len(r.JSON)
		}
		object := float64(total) / float64(len(csv))
		t.Logf("%-42s %5d bytes a row, JSON at most %4.1f× a record's CSV, %4.1f× the object's", name+":", len(rows[0])+1, record, object)
		worstRecord, worstObject = max(worstRecord, record), max(worstObject, object)
	}
	t.Logf("worst: %.1f× per record, %.1f× per object; the bound is %d× plus %d bytes", worstRecord, worstObject, MaxRecordExpansionDefault, RecordExpansionAllowance)
	require.Less(t, worstRecord*1.5, float64(MaxRecordExpansionDefault), "ordinary data has room to spare")
}

// amplifyingHeaderCSV is the red team's object: a 1 MiB header of 4,096
// columns with 255-byte names, and 200 rows of an id and 4,095 empty
// fields. It became 211 MB in curated.fleet_records.
func amplifyingHeaderCSV() string {
	rnd := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	name := make([]byte, 255)
	for i := range 4096 {
		if i > 0 {
			b.WriteByte(',')
		}
		for j := range name {
			name[j] = byte('a' + rnd.IntN(26))
		}
		b.Write(name)
	}
	b.WriteByte('\n')
	for i := range 200 {
		fmt.Fprintf(&b, "r%d%s\n", i, strings.Repeat(",", 4095))
	}
	return b.String()
}

// TestCSVRecordExpansionBound: a CSV record whose JSON is more than
// MaxRecordExpansion × its CSV bytes plus RecordExpansionAllowance fails
// its object naming object and line; exactly at the bound it loads.
func TestCSVRecordExpansionBound(t *testing.T) {
	t.Parallel()
	t.Run("the red team's header", func(t *testing.T) {
		t.Parallel()
		recs, err := readLimited(t, Limits{}, map[string]string{"f/wide.csv": amplifyingHeaderCSV()})
		require.ErrorIs(t, err, ErrMalformed)
		require.ErrorContains(t, err, "f/wide.csv: line 2: 4098 bytes of CSV become more than 135232 bytes of JSON (at most 32× plus 4096 bytes")
		require.Empty(t, recs)
	})
	// One column named n bytes, rows "v\n": the record {"name":"v"} is
	// n+8 bytes of JSON from 2 bytes of CSV; with MaxRecordExpansion 2 the
	// bound is 2×2+4096 = 4100 bytes.
	oneColumn := func(n int) string { return strings.Repeat("k", n) + "\nv\n" }
	t.Run("at the bound", func(t *testing.T) {
		t.Parallel()
		recs, err := readLimited(t, Limits{MaxRecordExpansion: 2}, map[string]string{"f/a.csv": oneColumn(4092)})
		require.NoError(t, err)
		require.Len(t, recs, 1)
		require.Len(t, recs[0].JSON, 4100)
	})
	t.Run("one byte over", func(t *testing.T) {
		t.Parallel()
		_, err := readLimited(t, Limits{MaxRecordExpansion: 2}, map[string]string{"f/a.csv": "k\n1\n", "f/b.csv": oneColumn(4093)})
		require.ErrorIs(t, err, ErrMalformed)
		require.ErrorContains(t, err, "f/b.csv: line 2: 2 bytes of CSV become more than 4100 bytes of JSON")
	})
	t.Run("a record's bytes include all its lines", func(t *testing.T) {
		t.Parallel()
		// "aaaaaaaaaa\nb"\n is 15 bytes of CSV over two lines; its record
		// is n+20 bytes of JSON: at the bound of 2×15+4096 with n = 4106,
		// which only the last line's 3 bytes would not allow.
		row := "\"aaaaaaaaaa\nb\"\n"
		require.Len(t, row, 15)
		recs, err := readLimited(t, Limits{MaxRecordExpansion: 2}, map[string]string{"f/a.csv": strings.Repeat("k", 4106) + "\n" + row})
		require.NoError(t, err)
		require.Len(t, recs, 1)
		require.Len(t, recs[0].JSON, 2*15+4096)
	})
	t.Run("no overflow with a huge factor", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, int64(math.MaxInt64), Limits{MaxRecordExpansion: math.MaxInt}.expanded(1<<40))
		recs, err := readLimited(t, Limits{MaxRecordExpansion: math.MaxInt}, map[string]string{"f/a.csv": "a,b\n1,2\n"})
		require.NoError(t, err)
		require.Len(t, recs, 1)
	})
}

// TestCSVObjectExpansionBound: tiny rows under a long header each stay
// within the per-record allowance, but the object's records together may
// only be MaxRecordExpansion × the object's bytes read so far plus one
// allowance: a 4,000-byte column name over rows "x\n" (4,008 bytes of JSON
// from 2 bytes of CSV each, 2,000× over a million rows) fails at the
// record that crosses it.
func TestCSVObjectExpansionBound(t *testing.T) {
	t.Parallel()
	const nameBytes = 4000
	csv := strings.Repeat("n", nameBytes) + "\n" + strings.Repeat("x\n", 1000)
	// Record k (line k+1) brings the JSON to k × (nameBytes+8) bytes from
	// nameBytes+1+2k bytes of CSV.
	defaults := Limits{}.withDefaults()
	k := int64(1)
	for k*(nameBytes+8) <= defaults.expanded(nameBytes+1+2*k) {
		k++
	}
	require.Equal(t, int64(34), k)
	_, err := readLimited(t, Limits{}, map[string]string{"f/tiny.csv": csv})
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, fmt.Sprintf("f/tiny.csv: line %d: the object's first %d bytes of CSV become %d bytes of JSON, more than 32× plus 4096 bytes",
		k+1, nameBytes+1+2*k, k*(nameBytes+8)))

	// The count starts again with each object.
	small := strings.Repeat("n", nameBytes) + "\n" + strings.Repeat("x\n", 30)
	recs, err := readLimited(t, Limits{}, map[string]string{"f/a.csv": small, "f/b.csv": small, "f/c.csv": small})
	require.NoError(t, err)
	require.Len(t, recs, 90)
}

// TestNDJSONIsNotBoundByExpansion: NDJSON records are stored as given, so
// their JSON is never larger than their line; the bound does not apply.
func TestNDJSONIsNotBoundByExpansion(t *testing.T) {
	t.Parallel()
	line := `{"` + strings.Repeat("k", 10000) + `":1}` + "\n"
	recs, err := readLimited(t, Limits{MaxRecordExpansion: 2}, map[string]string{"f/a.ndjson": strings.Repeat(line, 3)})
	require.NoError(t, err)
	require.Len(t, recs, 3)
}
