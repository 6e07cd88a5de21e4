package redshift

import (
	"errors"
	"strconv"
)

// refuseDouble is the warehouse's bound on a record's numbers
// (folder.RefuseNumber): a number in a SUPER value is one of Redshift's
// scalar types (SMALLINT, INTEGER, BIGINT, DECIMAL of at most 38 digits,
// REAL or DOUBLE PRECISION; "SUPER type" and "Numeric types" in the
// Database Developer Guide), so one beyond DOUBLE PRECISION's range, such
// as 1e400, has no type to be stored as. COPY would fail the whole load
// on it (or, as Redshift has been seen to do with out-of-range float8
// input, store ±Infinity in place of the value), so it is a bad record,
// refused before staging. Like PostgreSQL's float8in, which Redshift's
// float input descends from, a number too small to be anything but zero
// (1e-400, not 0e-400) is refused too: it would be stored as 0.
//
// The folder reader asks only about numbers written with an exponent or
// at least 300 bytes long, all others being within range.
func refuseDouble(number []byte) string {
	f, err := strconv.ParseFloat(string(number), 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return "the number is beyond DOUBLE PRECISION's range (about ±1.8e308), the widest number a Redshift SUPER value holds"
	case err != nil:
		return "the number cannot be read: " + err.Error()
	case f == 0 && !zero(number):
		return "the number is too small for DOUBLE PRECISION (its magnitude is below about 4.9e-324), the widest number a Redshift SUPER value holds: it would be stored as 0"
	}
	return ""
}

// zero reports whether the JSON number's digits before its exponent are
// all zeros.
func zero(number []byte) bool {
	for _, c := range number {
		switch {
		case c == 'e' || c == 'E':
			return true
		case c >= '1' && c <= '9':
			return false
		}
	}
	return true
}
