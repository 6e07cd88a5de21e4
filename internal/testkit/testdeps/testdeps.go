// Package testdeps decides what a test does when a tool it needs is missing
// (promtool, pgbouncer, chromium, openssl, local-aws-sqs, goaws): make test
// installs every one of them first (scripts/test-deps.sh; as root, or
// after sudo make test-deps), so a missing tool fails the test and names
// the command that installs it. Only go test -short skips such a test.
//
// A tool that is there but does not work (a binary that will not start)
// fails the test under -short too: that is not a missing tool.
package testdeps

import "testing"

// Command is the one command that installs every tool the tests need.
const Command = "sudo make test-deps"

// Short reports whether the tests run under -short; a variable so that
// this package's callers can test both answers.
var Short = testing.Short

// Missing skips the test under -short and fails it otherwise, saying that
// tool could not be found (err) and how to install it: install says how to
// by hand (apt-get install prometheus, …).
// The caller returns right after it.
func Missing(t testing.TB, tool, install string, err error) {
	t.Helper()
	if Short() {
		t.Skipf("%s not found, test skipped under -short: %v", tool, err)
		return
	}
	t.Fatalf("%s not found: %v\n"+
		"make test installs it (scripts/test-deps.sh; Debian packages only as root: not root, it says to run %s first);\n"+
		"by hand: %s; or go test -short to skip the tests that need it", tool, err, Command, install)
}
