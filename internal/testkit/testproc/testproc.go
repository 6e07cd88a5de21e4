// Package testproc runs a test's helper process and measures it honestly.
//
// Peak memory: the ru_maxrss that wait4 reports for a child is not the
// child's own figure. Go starts children with vfork semantics (the child
// shares the parent's memory until exec), and Linux carries the parent's
// high-water RSS into the child's ru_maxrss at exec; a -race test binary
// runs at 60+ MiB, so every child "peaked" there. The child's own peak is
// VmHWM in /proc/self/status, read by the child itself before it exits
// (ReportPeakRSS) and parsed by the parent (PeakRSS).
//
// The race detector's shadow memory roughly doubles a process's resident
// memory, so memory bounds are asserted on a helper built without it
// (NonRaceTestBinary).
package testproc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// RaceEnabled reports whether this binary was built with -race.
const RaceEnabled = raceEnabled

// NonRaceTestBinary returns the path of a test binary of the calling
// package built without the race detector: os.Args[0] when this binary
// already is one, otherwise a copy built with `go test -c` in the package
// directory (a test's working directory) into t.TempDir(). Run it with
// -test.run naming a helper test, as one would run os.Args[0].
func NonRaceTestBinary(t testing.TB) string {
	t.Helper()
	if !RaceEnabled {
		return os.Args[0]
	}
	path := filepath.Join(t.TempDir(), "norace.test")
	out, err := exec.Command("go", "test", "-c", "-o", path, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("building a test binary without -race: %v\n%s", err, out)
	}
	return path
}

const peakMarker = "testproc-peak-rss-bytes:"

// SelfPeakRSS returns this process's peak resident set size (VmHWM).
func SelfPeakRSS() (int64, error) { return peakRSS("/proc/self/status") }

// ProcessPeakRSS returns the peak resident set size (VmHWM) of a running
// process, such as a binary under test started by this one: the figure is
// the process's own since its exec, unlike wait4's ru_maxrss.
func ProcessPeakRSS(pid int) (int64, error) { return peakRSS(fmt.Sprintf("/proc/%d/status", pid)) }

func peakRSS(statusFile string) (int64, error) {
	b, err := os.ReadFile(statusFile)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing VmHWM %q: %w", rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM in %s", statusFile)
}

// ReportPeakRSS prints this process's peak RSS on stdout for PeakRSS; a
// helper process calls it last.
func ReportPeakRSS(t testing.TB) {
	t.Helper()
	n, err := SelfPeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("\n%s%d\n", peakMarker, n)
}

// PeakRSS finds the figure ReportPeakRSS printed in a helper's output.
func PeakRSS(t testing.TB, out []byte) int64 {
	t.Helper()
	for line := range strings.Lines(string(out)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), peakMarker); ok {
			n, err := strconv.ParseInt(rest, 10, 64)
			if err != nil {
				t.Fatalf("helper reported peak RSS %q: %v", rest, err)
			}
			return n
		}
	}
	t.Fatalf("helper reported no peak RSS:\n%s", out)
	return 0
}
