package testdeps

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// recorder is a testing.TB whose Fatalf and Skipf are recorded, not acted on.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                      {}
func (r *recorder) Fatalf(f string, args ...any) { r.fatal = fmt.Sprintf(f, args...) }
func (r *recorder) Skipf(f string, args ...any)  { r.skip = fmt.Sprintf(f, args...) }

// TestMissingFailsUnlessShort: a missing tool fails the test, naming the
// one command that installs everything and what installs this tool; under
// -short it skips the test instead.
func TestMissingFailsUnlessShort(t *testing.T) {
	defer func(short func() bool) { Short = short }(Short)
	err := errors.New(`exec: "promtool": executable file not found in $PATH`)

	Short = func() bool { return false }
	r := &recorder{TB: t}
	Missing(r, "promtool", "apt-get install prometheus", err)
	require.Empty(t, r.skip)
	require.Contains(t, r.fatal, "promtool not found: "+err.Error())
	require.Contains(t, r.fatal, "make test installs it")
	require.Contains(t, r.fatal, "sudo make test-deps")
	require.Contains(t, r.fatal, "apt-get install prometheus")
	require.Contains(t, r.fatal, "go test -short")

	Short = func() bool { return true }
	r = &recorder{TB: t}
	Missing(r, "promtool", "apt-get install prometheus", err)
	require.Empty(t, r.fatal)
	require.Contains(t, r.skip, "promtool not found, test skipped under -short: "+err.Error())
}
