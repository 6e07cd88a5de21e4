package folder

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// numberCases are JSON numbers at and around PostgreSQL numeric's bounds;
// storable says whether jsonb accepts them (checked against the server by
// TestNDJSONNumbersMatchWhatJSONBStores).
var numberCases = []struct {
	number   string
	storable bool
}{
	{"1e1000000", false}, // the repro
	{"-1e1000000", false},
	{"1e131071", true}, // 131072 digits before the point
	{"9.9e131071", true},
	{"99e131070", true},
	{"1e131072", false},
	{"99e131071", false},
	{"0.1e131072", true},
	{"0.01e131073", true},
	{"0.1e131073", false},
	{"1" + strings.Repeat("0", 131071), true}, // 131072 digits, no exponent
	{"1" + strings.Repeat("0", 131072), false},
	{"-" + strings.Repeat("9", 131072) + ".5", true},
	{"1e-16383", true}, // 16383 digits after the point
	{"1e-16384", false},
	{"1.0e-16383", false}, // written zeros count
	{"123.456e-16380", true},
	{"123.4567e-16380", false},
	{"0e-16383", true},
	{"0e-16384", false},
	{"0.00000e-16380", false},
	{"0." + strings.Repeat("0", 16382) + "1", true},
	{"0." + strings.Repeat("0", 16383) + "1", false},
	{"0." + strings.Repeat("0", 16384), false}, // zero, but its scale is too large
	{"0e1000000", true},                        // zero has no digits to overflow
	{"0e1073741822", true},
	{"0e1073741823", false}, // an exponent numeric_in refuses whatever the digits
	{"0e-1073741823", false},
	{"0e2147483647", false},
	{"1e99999999999999999999", false},
	{"1e-99999999999999999999", false},
	{"1e0000000000000000000000005", true}, // leading zeros of the exponent
	{"1e-0000000000000000000016384", false},
	{"1e1000", true},
	{"1e-1000", true},
	{"1e400", true}, // beyond DOUBLE PRECISION, within numeric
	{"-0", true},
	{"1E+5", true},
	{"1E+1000000", false}, // a capital E, a sign
	{"-2.5E-16384", false},
	{"1e+0", true},
	{"0.5", true},
}

// TestNDJSONNumbersMatchWhatJSONBStores casts each number case, and 300
// random numbers near numeric's bounds, to jsonb in PostgreSQL: the reader
// refuses exactly the numbers jsonb refuses, as a bad record naming the
// object, line, column and JSON path, and reads the others.
func TestNDJSONNumbersMatchWhatJSONBStores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	storable := func(line string) bool {
		var n int
		err := conn.QueryRow(ctx, `SELECT octet_length($1::text::jsonb::text)`, line).Scan(&n)
		return err == nil
	}
	for i, tc := range numberCases {
		line := `{"id":1,"reading":{"values":[0,` + tc.number + `]}}`
		short := tc.number[:min(len(tc.number), 40)]
		require.Equal(t, tc.storable, storable(line), "jsonb and the case disagree on %s", short)

		name := fmt.Sprintf("f/%d.ndjson", i)
		_, bad, err := readWith(t, Limits{}, 1, map[string]string{name: "{}\n  " + line + "\n"})
		require.NoError(t, err, short)
		if tc.storable {
			require.Empty(t, bad, short)
			continue
		}
		require.Len(t, bad, 1, short)
		require.Equal(t, name, bad[0].ObjectKey)
		require.EqualValues(t, 2, bad[0].Line, short)
		require.Equal(t, 2+strings.Index(line, tc.number)+1, bad[0].Column, "%s: the column where the number starts", short)
		require.True(t, strings.HasPrefix(bad[0].Reason, "the value at $.reading.values[1]: the number "), "%s: %s", short, bad[0].Reason)
		require.Contains(t, bad[0].Reason, "PostgreSQL's numeric", short)
		require.True(t, strings.HasPrefix(bad[0].Excerpt, `"`+short), "%s: the excerpt is the number: %s", short, bad[0].Excerpt)
	}

	rng := rand.New(rand.NewPCG(44, 6))
	for range 300 {
		n := randomNumber(rng)
		u, refused := checkValues([]byte(`{"n":`+n+`}`), nil)
		require.Equal(t, storable(`{"n":`+n+`}`), !refused, "jsonb and the reader disagree on %s (%s)", n, u.why)
	}
}

// randomNumber returns a JSON number near one of numeric's bounds.
func randomNumber(rng *rand.Rand) string {
	digits := func(n int, leadingZeros bool) string {
		var b strings.Builder
		for i := range n {
			d := rng.IntN(10)
			if i == 0 && !leadingZeros && d == 0 {
				d = 1
			}
			b.WriteByte(byte('0' + d))
		}
		return b.String()
	}
	var b strings.Builder
	if rng.IntN(2) == 0 {
		b.WriteByte('-')
	}
	if rng.IntN(4) == 0 {
		b.WriteByte('0')
	} else {
		b.WriteString(digits(1+rng.IntN(6), false))
	}
	if rng.IntN(2) == 0 {
		b.WriteByte('.')
		if rng.IntN(3) == 0 {
			b.WriteString(strings.Repeat("0", rng.IntN(5)))
		}
		b.WriteString(digits(1+rng.IntN(6), true))
	}
	var exp int
	switch rng.IntN(4) {
	case 0:
		exp = 131072 - 8 + rng.IntN(16)
	case 1:
		exp = -16383 - 8 + rng.IntN(16)
	case 2:
		exp = 1<<30 - 3 + rng.IntN(4)
		if rng.IntN(2) == 0 {
			exp = -exp
		}
	default:
		exp = rng.IntN(400) - 200
	}
	fmt.Fprintf(&b, "e%d", exp)
	return b.String()
}

// TestUnstorableValuesAreBadRecords: each value jsonb refuses (a number
// beyond numeric, \u0000 in a value or a key, a lone surrogate, invalid
// UTF-8) makes its record a bad record naming the object, the line, the
// 1-based byte column where the value starts, its JSON path and why, with
// the value as its excerpt; the first such value of a record is reported;
// within the tolerance the good records around them are read. A CSV
// value's reason names its header's column.
func TestUnstorableValuesAreBadRecords(t *testing.T) {
	t.Parallel()
	ndjson := strings.Join([]string{
		`{"id":1,"t":1.5e10}`,
		`{"id":2,"reading":1e1000000}`,
		`	{"id":3,"tags":["a","b\u0000c"]}`,
		`{"id":4,"a\u0000":true}`,
		`{"id":5,"s":{"x y":"\udc00"}}`,
		"{\"id\":6,\"s\":\"caf\xe9\"}",
		`{"id":7,"first":1e-16384,"then":"\u0000"}`,
		`{"id":8,"text":"1e1000000 as text, \\u0000 too"}`,
	}, "\n") + "\n"
	csv := "id,note\n1,ok\n2,caf\xe9\n3,fine\n"
	recs, bad, err := readTolerant(t, 10, map[string]string{"f/a.ndjson": ndjson, "f/b.csv": csv})
	require.NoError(t, err)
	var good []string
	for _, r := range recs {
		good = append(good, fmt.Sprintf("%s:%d", r.ObjectKey, r.Line))
	}
	require.Equal(t, []string{"f/a.ndjson:1", "f/a.ndjson:8", "f/b.csv:2", "f/b.csv:4"}, good)
	require.Equal(t, []BadRecord{
		{ObjectKey: "f/a.ndjson", Line: 2, Column: 19, Excerpt: `"1e1000000"`,
			Reason: "the value at $.reading: the number has 1000001 digits before the decimal point, more than the 131072 PostgreSQL's numeric holds"},
		{ObjectKey: "f/a.ndjson", Line: 3, Column: 22, Excerpt: `"\"b\\u0000c\""`,
			Reason: `the value at $.tags[1]: NUL characters (\u0000) cannot be stored`},
		{ObjectKey: "f/a.ndjson", Line: 4, Column: 9, Excerpt: `"\"a\\u0000\""`,
			Reason: `a key of $: NUL characters (\u0000) cannot be stored`},
		{ObjectKey: "f/a.ndjson", Line: 5, Column: 20, Excerpt: `"\"\\udc00\""`,
			Reason: `the value at $.s["x y"]: an unpaired UTF-16 surrogate escape cannot be stored`},
		{ObjectKey: "f/a.ndjson", Line: 6, Column: 13, Excerpt: `"\"caf\xe9\""`,
			Reason: "the value at $.s: invalid UTF-8 cannot be stored"},
		{ObjectKey: "f/a.ndjson", Line: 7, Column: 17, Excerpt: `"1e-16384"`,
			Reason: "the value at $.first: the number has 16384 digits after the decimal point, more than the 16383 PostgreSQL's numeric holds"},
		{ObjectKey: "f/b.csv", Line: 3, Column: 2, Excerpt: `"caf\xe9"`,
			Reason: `column "note": invalid UTF-8`},
	}, bad)
}

// TestRefuseNumbersIsAskedOnlyAboutNumbersThatMayBeOutOfRange: a
// warehouse's RefuseNumber refuses numbers numeric holds (here every
// number over 1e308) as bad records with the reader's object, line,
// column and path; it is asked only about numbers written with an exponent
// or at least 300 bytes long, after numeric's own bounds.
func TestRefuseNumbersIsAskedOnlyAboutNumbersThatMayBeOutOfRange(t *testing.T) {
	t.Parallel()
	long := "1" + strings.Repeat("0", 299)
	writeMem(t, "refuse-numbers", map[string]string{"f/a.ndjson": strings.Join([]string{
		`{"a":1,"b":-2.25,"c":123456789012345678901234567890,"d":"1e999"}`,
		`{"a":1e308}`,
		`{"a":[1e309]}`,
		`{"a":` + long + `}`,
		`{"a":` + long + `0}`,
		`{"a":1e1000000}`,
	}, "\n")})
	ctx := context.Background()
	f, err := Canonicalize("mem://refuse-numbers/f")
	require.NoError(t, err)
	src, err := Opener{}.Open(ctx, f)
	require.NoError(t, err)
	defer src.Close()
	src.Tolerate(10)
	objs, err := src.Objects(ctx)
	require.NoError(t, err)
	rr := src.Records(ctx, objs)
	defer rr.Close()
	var asked []string
	rr.RefuseNumbers(func(n []byte) string {
		asked = append(asked, string(n[:min(len(n), 10)]))
		if len(n) > 300 || strings.HasPrefix(string(n), "1e309") {
			return "over 1e308"
		}
		return ""
	})
	var lines []int64
	for rr.Next() {
		lines = append(lines, rr.Record().Line)
	}
	require.NoError(t, rr.Err())
	require.Equal(t, []int64{1, 2, 4}, lines)
	require.Equal(t, []string{"1e308", "1e309", long[:10], long[:10]}, asked, "asked about exponents and long numbers only, not about what numeric refuses")
	bad := rr.Bad()
	require.Len(t, bad, 3)
	require.Equal(t, BadRecord{ObjectKey: "f/a.ndjson", Line: 3, Column: 7, Reason: "the value at $.a[0]: over 1e308", Excerpt: `"1e309"`}, bad[0])
	require.Equal(t, "the value at $.a: over 1e308", bad[1].Reason)
	require.Contains(t, bad[2].Reason, "PostgreSQL's numeric")
}

// TestNestingBeyondTheParserIsNamed: a record nested 10,000 levels deep is
// read (and jsonb stores it), one nested deeper is a bad record saying so.
func TestNestingBeyondTheParserIsNamed(t *testing.T) {
	t.Parallel()
	nested := func(n int) string {
		return strings.Repeat(`{"a":`, n) + `"x{["` + strings.Repeat("}", n)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT octet_length($1::text::jsonb::text)`, nested(maxNesting)).Scan(&n))

	recs, bad, err := readTolerant(t, 1, map[string]string{"f/a.ndjson": nested(maxNesting) + "\n" + nested(maxNesting+1) + "\n"})
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Len(t, bad, 1)
	require.EqualValues(t, 2, bad[0].Line)
	require.Equal(t, "not a JSON object: nested more than 10000 levels deep", bad[0].Reason)
}

// TestLocateNamesThePath: the JSON path of a value, of a key, through
// arrays and keys that are not plain names, cut when very long.
func TestLocateNamesThePath(t *testing.T) {
	t.Parallel()
	doc := `{"a":{"b c":[1,{"d":[true,"x"]}],"e\"f":null},"g":2}`
	for _, c := range []struct {
		at   string
		path string
		key  bool
	}{
		{`"x"`, `$.a["b c"][1].d[1]`, false},
		{`true`, `$.a["b c"][1].d[0]`, false},
		{`null`, `$.a["e\"f"]`, false},
		{`"e\"f"`, `$.a`, true},
		{`"d"`, `$.a["b c"][1]`, true},
		{`2`, `$.g`, false},
	} {
		off := strings.Index(doc, c.at)
		loc := locate([]byte(doc), off+len(c.at)-1)
		require.Equal(t, c.path, loc.path, c.at)
		require.Equal(t, c.key, loc.key, c.at)
		require.Equal(t, c.at, doc[loc.start:loc.end])
	}
	deep := strings.Repeat(`{"abcdefgh":`, 100) + "1" + strings.Repeat("}", 100)
	loc := locate([]byte(deep), strings.Index(deep, "1"))
	require.LessOrEqual(t, len(loc.path), maxPathBytes+len("…"))
	require.True(t, strings.HasSuffix(loc.path, "…"), loc.path)
}
